"""Test modules share helpers through ``tests/fixtures/`` only: no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_modules(path: Path) -> list[str]:
    """The ``tests.<dir>.test_*`` modules ``path`` imports (at any depth, inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found += [n for n in names if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("def f():\n    from tests.unit.test_other import helper\n")
    assert imported_test_modules(bad) == ["tests.unit.test_other"]  # the check sees imports inside functions

    offenders = {str(p.relative_to(TESTS)): mods for p in sorted(TESTS.rglob("test_*.py"))
                 if (mods := imported_test_modules(p))}
    assert offenders == {}, "move the shared helpers into tests/fixtures/: " + repr(offenders)
