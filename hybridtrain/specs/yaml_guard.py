"""YamlGuard: a bounded, strict YAML parse of a file a person (or an attacker) wrote.

Config files are read at every stage and validated by ``hybridtrain validate`` before anything
runs, so a hostile file must come back as located problems in bounded time and memory, never as
a traceback, an OOM kill or a silently different document:

- **size**: at most ``MAX_BYTES`` (1 MiB) — specs, catalogs and policies are a few KB;
- **encoding**: UTF-8 only; a bad byte or a binary file is reported with its line;
- **NUL**: a NUL character anywhere (raw, or escaped as ``"\\0"`` in a quoted scalar) is refused;
- **depth**: at most ``MAX_DEPTH`` nested collections, checked on the event stream *before* a
  tree is built, so a 100,000-deep ``[[[[...`` never reaches a recursive composer;
- **alias expansion**: the document as the validator will see it (every alias expanded) may hold
  at most ``MAX_NODES`` nodes — counted once per node with memoized subtree sizes, so a
  "billion laughs" file is measured in linear time and refused; a recursive alias is refused;
- **duplicate keys**: YAML's "last one wins" would let a second ``email: {treatment: keep}``
  silently override the first; both lines are named instead.

``parse`` returns the constructed data and the composed node tree (which ``config_file`` turns
into a field-path -> line index without walking aliases more than once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from hybridtrain.errors import Problem

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000

# libyaml when PyYAML has it: ~10x faster, and its parser is not recursive.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Parsed:
    """A guarded YAML document: its data and its composed node tree (None for an empty file)."""

    data: Any
    root: yaml.Node | None


class YamlRefused(Exception):
    """The document breaks one of the guard's bounds or rules; ``problems`` say where."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def decode(raw: bytes) -> str:
    """UTF-8 text of ``raw``; ``YamlRefused`` naming the line of the first bad byte or a NUL."""
    if len(raw) > MAX_BYTES:
        raise YamlRefused([Problem("", f"file is {len(raw):,} bytes; config files are limited to "
                                       f"{MAX_BYTES:,} bytes (is this the right file?)")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlRefused([Problem("", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                                       "is it a binary file? Save it as UTF-8", line)]) from None
    text = text.removeprefix("\ufeff")
    nul = text.find("\x00")
    if nul >= 0:
        raise YamlRefused([Problem("", "contains a NUL character; remove it (is it a binary file?)",
                                   text.count("\n", 0, nul) + 1)])
    return text


def _check_depth(text: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlRefused([Problem("", f"nested more than {MAX_DEPTH} levels deep; config files "
                                               "are never this deep", event.start_mark.line + 1)])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_tree(root: yaml.Node) -> None:
    """Expanded size, recursion, duplicate keys and escaped NULs — each node visited once."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    problems: list[Problem] = []
    # Iterative post-order walk: (node, children pushed yet?, its dotted path — the first one, for an alias).
    stack: list[tuple[yaml.Node, bool, str]] = [(root, False, "")]
    while stack:
        node, expanded, path = stack.pop()
        nid = id(node)
        if expanded:
            active.discard(nid)
            children = _children(node)
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[nid] = total
            if total > MAX_NODES:
                raise YamlRefused([Problem("", f"expands to more than {MAX_NODES:,} values through anchors "
                                               "and aliases (an alias bomb?); write the values out",
                                           node.start_mark.line + 1)])
            continue
        if nid in sizes:
            continue
        if nid in active:
            raise YamlRefused([Problem("", "an alias refers to the collection that contains it (a recursive "
                                           "document); remove the alias", node.start_mark.line + 1)])
        active.add(nid)
        stack.append((node, True, path))
        if isinstance(node, yaml.ScalarNode):
            if "\x00" in node.value:
                problems.append(Problem("", "contains a NUL character (\\0); remove it", node.start_mark.line + 1))
        elif isinstance(node, yaml.MappingNode):
            problems += _duplicate_keys(node, path)
        for child, where in _children_at(node, path):
            cid = id(child)
            if cid in active:
                raise YamlRefused([Problem("", "an alias refers to the collection that contains it (a recursive "
                                               "document); remove the alias", child.start_mark.line + 1)])
            if cid not in sizes:
                stack.append((child, False, where))
    if problems:
        raise YamlRefused(problems)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _children_at(node: yaml.Node, path: str) -> list[tuple[yaml.Node, str]]:
    """Each child with its dotted path (``sweep.n_trials``, ``sites.0.hosts``), as a ``Problem`` names a field."""
    def at(part: str) -> str:
        return f"{path}.{part}" if path else part
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            out += [(key, at(name)), (value, at(name))]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(child, at(str(i))) for i, child in enumerate(node.value)]
    return []


def _duplicate_keys(node: yaml.MappingNode, path: str = "") -> list[Problem]:
    first: dict[str, int] = {}
    problems = []
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        key = key_node.value
        if key in first:
            problems.append(Problem(f"{path}.{key}" if path else key, f"key {key!r} appears twice (lines {first[key]} and {line}); YAML would "
                                         "silently keep only the last one — remove or merge one of them", line))
        else:
            first[key] = line
    return problems


def parse(text: str) -> Parsed:
    """Parse ``text`` within the bounds; ``yaml.YAMLError`` for syntax errors, ``YamlRefused`` for the rest."""
    _check_depth(text)
    loader = _LOADER(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return Parsed(None, None)
        _check_tree(root)
        try:
            data = loader.construct_document(root)
        except (ValueError, OverflowError) as exc:
            # e.g. a timestamp with month 13, an integer of more than 4300 digits.
            why = ("a number has more than 4,300 digits" if "integer string conversion" in str(exc)
                   else f"a value cannot be read ({exc})")
            raise YamlRefused([Problem("", f"{why}; fix the value")]) from None
    finally:
        loader.dispose()
    return Parsed(data, root)
