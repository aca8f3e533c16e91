"""Flow-tier fixtures: workspaces with small generated data and spec variants sized for tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

SpecWriter = Callable[..., Path]


