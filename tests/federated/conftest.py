"""Federated fixtures: a workspace with three on-prem data sites and the sample data split over them
(the helpers behind it are in ``tests/fixtures/federated_jobs.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.federated_jobs import build_federated_workspace


@pytest.fixture(scope="module")
def fed_workspace(tmp_path_factory) -> tuple[Path, list[dict]]:
    return build_federated_workspace(tmp_path_factory.mktemp("fed") / "ws")
