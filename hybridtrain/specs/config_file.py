"""ConfigFile: a YAML document validated into a pydantic model, with every problem located.

Specs, the sites catalog and the policy are all YAML files a person edits by hand, so a mistake
must come back as ``file: field.path (line N): what is wrong`` for *every* problem at once,
never as a traceback or only the first error.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs import yaml_guard

M = TypeVar("M", bound=BaseModel)


def dotted(loc: Iterable[Any]) -> str:
    """Render a pydantic error location as ``a.b[2].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _line_index(root: yaml.Node | None) -> dict[tuple[Any, ...], int]:
    """Map each key path in a composed YAML document to its 1-based line number (best effort).

    A node reached again through an alias is not walked again: an alias-heavy document is
    indexed in time linear in its text, not in its expansion.
    """
    index: dict[tuple[Any, ...], int] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        index.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a complex key: the constructor has refused it already
                key = key_node.value
                index.setdefault(path + (key,), key_node.start_mark.line + 1)
                stack.append((value_node, path + (key,)))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                stack.append((item, path + (i,)))
    return index


def _nearest_line(index: Mapping[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in index:
            return index[loc[:cut]]
    return None


def problems_from_validation_error(
    err: ValidationError, lines: Mapping[tuple[Any, ...], int] | None = None
) -> list[Problem]:
    """One ``Problem`` per pydantic error, with the field path and (when known) its line."""
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (remove it or check its spelling)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error" and "expected" in (e.get("ctx") or {}):
            msg = f"must be {e['ctx']['expected']}"
        # pydantic wraps ValueErrors from validators as "Value error, ..."; keep the message.
        msg = msg.removeprefix("Value error, ")
        problems.append(Problem(dotted(loc), msg, _nearest_line(lines or {}, loc)))
    return problems


class LineIndex(Mapping[tuple[Any, ...], int]):
    """``_line_index`` of a composed document, built on first lookup: only a file with a problem needs it."""

    def __init__(self, root: yaml.Node | None):
        self._root = root
        self._index: dict[tuple[Any, ...], int] | None = None

    def _built(self) -> dict[tuple[Any, ...], int]:
        if self._index is None:
            self._index = _line_index(self._root)
        return self._index

    def __getitem__(self, key: tuple[Any, ...]) -> int:
        return self._built()[key]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


def read_yaml(path: Path) -> tuple[Any, Mapping[tuple[Any, ...], int]]:
    """Parse a YAML file within ``yaml_guard``'s bounds; ``SpecError`` naming the file and line otherwise."""
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            yamls = sorted(p.name for p in path.glob("*.y*ml"))[:3]
            hint = f" (it holds {', '.join(yamls)})" if yamls else ""
            raise SpecError(str(path), [Problem("", f"is a directory, not a YAML file; give the file's path{hint}")])
        why = "is not a regular file" if path.exists() else "file not found"
        raise SpecError(str(path), [Problem("", f"{why}; check the path")])
    try:
        with path.open("rb") as fh:
            raw = fh.read(yaml_guard.MAX_BYTES + 1)
        parsed = yaml_guard.parse(yaml_guard.decode(raw))
    except yaml_guard.YamlRefused as exc:
        raise SpecError(str(path), exc.problems) from None
    except OSError as exc:
        raise SpecError(str(path), [Problem("", f"cannot be read: {exc.strerror or exc}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [_syntax_problem(exc)]) from None
    if parsed.data is None:
        raise SpecError(str(path), [Problem("", "file is empty; expected a YAML mapping")])
    return parsed.data, LineIndex(parsed.root)


def _syntax_problem(exc: yaml.YAMLError) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc)
    if getattr(exc, "context", None):
        problem = f"{problem} ({exc.context})"
    return Problem("", f"not valid YAML: {problem}", line)


def load_model(
    model: type[M],
    path: Path | str,
    *,
    semantic: Callable[[M], list[Problem]] | None = None,
) -> M:
    """Load ``path`` into ``model``; run ``semantic`` checks; raise one ``SpecError`` with all problems."""
    data, lines = read_yaml(Path(path))
    return validate_data(model, data, source=str(path), lines=lines, semantic=semantic)


def validate_data(
    model: type[M],
    data: Any,
    *,
    source: str,
    lines: Mapping[tuple[Any, ...], int] | None = None,
    semantic: Callable[[M], list[Problem]] | None = None,
) -> M:
    """Validate already-parsed data (e.g. a spec passed as a Prefect parameter)."""
    if not isinstance(data, dict):
        raise SpecError(source, [Problem("", f"expected a mapping, got {type(data).__name__}")])
    try:
        obj = model.model_validate(data)
    except ValidationError as err:
        problems = problems_from_validation_error(err, lines)
        if semantic is not None:
            # Best effort to report *every* problem: drop the fields that failed and, if the rest
            # validates, run the cross-field checks too (a fix-one-rerun loop wastes the user's time).
            rest = None
            pruned, failed = data, err
            for _ in range(4):  # a removed value can uncover another error below it
                pruned = _pruned(pruned, failed)
                try:
                    rest = model.model_validate(pruned)
                    break
                except ValidationError as again:
                    failed = again
            if rest is not None:
                seen = {p.path for p in problems}
                problems += [
                    Problem(p.path, p.message, p.line or _nearest_line(lines or {}, _split(p.path)))
                    for p in semantic(rest)
                    if p.path not in seen
                ]
        raise SpecError(source, problems) from None
    if semantic is not None:
        problems = semantic(obj)
        if problems:
            located = [
                Problem(p.path, p.message, p.line or _nearest_line(lines or {}, _split(p.path)))
                for p in problems
            ]
            raise SpecError(source, located)
    return obj


def _pruned(data: Any, err: ValidationError) -> Any:
    """A copy of ``data`` without the values at the failing locations (defaults fill them back)."""
    out = copy.deepcopy(data)
    for e in err.errors(include_url=False):
        node, loc = out, list(e["loc"])
        for part in loc[:-1]:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if isinstance(node, dict) and loc and loc[-1] in node:
            del node[loc[-1]]
    return out


def _split(path: str) -> tuple[Any, ...]:
    parts: list[Any] = []
    for chunk in path.replace("]", "").split("."):
        name, *idx = chunk.split("[")
        if name:
            parts.append(name)
        parts.extend(int(i) for i in idx if i.isdigit())
    return tuple(parts)
