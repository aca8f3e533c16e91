"""House rule 1: importing the core (every module of it) imports no Prefect and creates no files."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import hybridtrain


def test_core_modules_import_without_prefect(tmp_path):
    modules = sorted(m.name for m in pkgutil.walk_packages(hybridtrain.__path__, "hybridtrain."))
    assert "hybridtrain.cli.main" in modules and "hybridtrain.specs.job" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(k for k in sys.modules if k == 'prefect' or k.startswith('prefect.'))\n"
        "print('PREFECT:', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "PREFECT: []" in out.stdout
    # Nothing happens at import time: no directories or files appear in the working directory.
    assert list(Path(tmp_path).iterdir()) == []
