"""Tests share helpers through ``tests/fixtures/`` only: no test module imports another, and no test directory
imports a helper that lives in another test directory."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def misplaced_imports(path: Path) -> list[str]:
    """The ``tests.*`` modules ``path`` imports (at any depth, inside functions too) that are another test module,
    or a helper in a test directory other than its own and ``tests/fixtures``."""
    own = path.parent.name
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] != "tests" or len(parts) < 3 or parts[1] == "fixtures":
                continue
            if parts[-1].startswith("test_") or parts[1] != own:
                found.append(name)
    return found


def test_helpers_are_shared_through_fixtures_only(tmp_path):
    bad = tmp_path / "unit" / "test_bad.py"
    bad.parent.mkdir()
    bad.write_text("from tests.integration.helpers import a\n\ndef f():\n    from tests.unit.test_other import helper\n")
    assert misplaced_imports(bad) == ["tests.integration.helpers", "tests.unit.test_other"]  # inside functions too

    offenders = {str(p.relative_to(TESTS)): mods for p in sorted(TESTS.rglob("*.py"))
                 if (mods := misplaced_imports(p))}
    assert offenders == {}, "move the shared helpers into tests/fixtures/: " + repr(offenders)


def test_the_longest_first_list_names_test_files_that_exist_and_puts_them_first():
    from tests.conftest import LONGEST_FIRST, pytest_collection_modifyitems

    missing = [p for p in LONGEST_FIRST if not (TESTS.parent / p).is_file()]
    assert missing == [], "a renamed or removed test file is still in tests/conftest.py LONGEST_FIRST"

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    items = [Item("tests/unit/test_a.py::test_1"), Item(f"{LONGEST_FIRST[1]}::test_x"),
             Item("tests/unit/test_a.py::test_2"), Item(f"{LONGEST_FIRST[0]}::test_y"),
             Item(f"{LONGEST_FIRST[1]}::test_z")]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [f"{LONGEST_FIRST[0]}::test_y", f"{LONGEST_FIRST[1]}::test_x",
                                         f"{LONGEST_FIRST[1]}::test_z", "tests/unit/test_a.py::test_1",
                                         "tests/unit/test_a.py::test_2"]
