"""ConfigMutations: hostile and broken variants of the project's config files, and a tally of how validate treats them.

Two corpora, both deterministic (seeded):

- ``must_refuse()`` — variants that are wrong by construction (a duplicate key, a NUL byte, an
  alias bomb, ``prefix: ../x``, an unknown strategy, a negative option...): ``validate`` must
  refuse each with exit 2; exit 0 is *wrongly accepted*;
- ``random_mutations(n)`` — line deletions and duplications, hostile scalars put at random
  places, cut-off files, random bytes: either answer is fine, a traceback or a blown bound is not.

Run as a script to print the tally (tried / clear error / traceback / wrongly accepted) for a
checkout — the current one, or an older one to compare::

    .venv/bin/python -m tests.unit.config_mutations [--checkout DIR] [--random 600]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = {"spec": "jobs/churn.yaml", "policy": "deployments/policy.yaml", "sites": "deployments/sites.yaml"}

HOSTILE_SCALARS = [
    "", "-1", "0", "-0.5", "1e309", ".nan", "-.inf", "99999999999d", "99999999999999999999", "9" * 5000,
    "../x", "../../../tmp/evil", "/etc/passwd", '"a\\0b"', "[a, b]", "{a: b}", "~", "true", "2026-13-45",
    "2026-12-01T18:00:00", "*undefined", "&anchor x", "!!python/object:os.system ls", "'", '"', "x" * 10000,
    "\u202e\u0000", "- a\n- b", "|\n  text",
]


@dataclass(frozen=True)
class Case:
    kind: str  # spec / policy / sites
    name: str
    content: bytes
    isolate: bool = False  # run in a subprocess with a memory cap: an unbounded parse must not kill the tally


def _text(kind: str, root: Path = ROOT) -> str:
    return (root / FILES[kind]).read_text()


def _dump(data: object) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def must_refuse(root: Path = ROOT) -> list[Case]:
    spec, policy, sites = _text("spec", root), _text("policy", root), _text("sites", root)
    data = yaml.safe_load(spec)
    cases = []

    def spec_case(name: str, **changes: object) -> None:
        d = yaml.safe_load(spec)
        for dotted, value in changes.items():
            node = d
            *parents, leaf = dotted.split("__")
            for p in parents:
                node = node[int(p)] if isinstance(node, list) else node[p]
            node[leaf] = value
        cases.append(Case("spec", name, _dump(d)))

    cases.append(Case("spec", "duplicate key turns a pseudonym column raw", spec.replace(
        "    email: {treatment: pseudonym}\n",
        "    email: {treatment: pseudonym}\n    email: {treatment: keep, reason: oops}\n").encode()))
    cases.append(Case("spec", "duplicate top-level key", (spec + "\nmodel: {features: {numeric: [x]}}\n").encode()))
    cases.append(Case("spec", "NUL in a path", spec.replace("path: data/raw/churn.csv",
                                                            'path: "data/raw/churn.csv\\0.txt"').encode()))
    cases.append(Case("spec", "raw NUL byte", spec.encode().replace(b"team: growth", b"team: gro\x00wth")))
    cases.append(Case("spec", "binary file", bytes(range(256)) * 8))
    cases.append(Case("spec", "latin-1 file", spec.replace("Monthly", "Monthly caf\u00e9").encode("latin-1")))
    cases.append(Case("spec", "deep nesting", b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", isolate=True))
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    cases.append(Case("spec", "alias bomb", ("\n".join(bomb) + "\n").encode(), isolate=True))
    cases.append(Case("spec", "alias bomb inside a spec", (spec + "\n".join(bomb) + "\n").encode(), isolate=True))
    spec_case("deadline overflow", deadline="99999999999d")
    spec_case("deadline beyond 10 years", deadline="5000d")
    spec_case("release prefix escapes", promotion__release_targets__1__prefix="../x")
    spec_case("release path escapes", promotion__release_targets__0__path="../../../tmp/evil")
    spec_case("unknown strategy", placement__strategy="fastest-ever")
    spec_case("job class not in the policy", placement__job_class="vip")
    spec_case("unknown gate", promotion__gates=["lineage", "vibes"])
    spec_case("dataset path escapes", dataset__path="../../etc/passwd")
    spec_case("suppression limit above 1", sensitive__max_suppressed_fraction=2)
    d = dict(data)
    d["model"] = dict(d["model"], epochs="many")
    d["placement"] = {"strategy": "nope"}
    cases.append(Case("spec", "structural and semantic at once", _dump(d)))
    cases.append(Case("policy", "negative max_onprem_wait_hours", policy.replace(
        "deadline_spot: {max_onprem_wait_hours: 1}", "deadline_spot: {max_onprem_wait_hours: -1}").encode()))
    cases.append(Case("policy", "NaN option", policy.replace(
        "deadline_spot: {max_onprem_wait_hours: 1}", "deadline_spot: {max_onprem_wait_hours: .nan}").encode()))
    cases.append(Case("policy", "duplicate job class", policy.replace(
        "job_classes:\n", "job_classes:\n  standard: {capacity_classes: [fixed, burst, opportunistic]}\n", 1).encode()))
    cases.append(Case("sites", "duplicate site key", sites.replace("sites:\n", "sites:\n", 1).replace(
        "kind: onprem", "kind: onprem\n    kind: cloud", 1).encode()))
    cases.append(Case("sites", "store path escapes the workspace", sites.replace(
        "path: .hybridtrain/stores/onprem-dc1", "path: ../../../tmp/evil").encode()))
    cases.append(Case("sites", "binary sites file", b"\x89PNG\r\n\x1a\n" + os.urandom(512)))
    return cases


def random_mutations(n: int, seed: int = 17, root: Path = ROOT) -> Iterator[Case]:
    rng = random.Random(seed)
    texts = {k: _text(k, root) for k in FILES}
    for i in range(n):
        kind = rng.choice(list(FILES))
        yield Case(kind, f"random-{i}", mutate(texts[kind], rng))


def mutate(text: str, rng: random.Random) -> bytes:
    """One to three random edits of ``text``: line drop/duplicate/swap, hostile scalar, cut, random bytes."""
    lines = text.splitlines(keepends=True)
    raw: bytes | None = None
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(lines))
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op in (3, 4):
            m = re.match(r"^(\s*(?:- )?[A-Za-z_][\w-]*:\s*)(.+)$", lines[i].rstrip("\n"))
            if m:
                lines[i] = m.group(1) + rng.choice(HOSTILE_SCALARS) + "\n"
            else:
                lines[i] = lines[i].replace(":", ": " + rng.choice(HOSTILE_SCALARS), 1)
        elif op == 5:
            data = "".join(lines).encode()
            raw = data[: rng.randrange(len(data))]
        else:
            data = bytearray("".join(lines).encode())
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            raw = bytes(data)
    return raw if raw is not None else "".join(lines).encode()


@dataclass
class Outcome:
    exit_code: int | None
    traceback: str | None
    seconds: float
    output: str


def run_validate(case: Case, workdir: Path, home: Path = ROOT) -> Outcome:
    """``hybridtrain validate`` in this process (the CLI's own entry point, its own error handling)."""
    from hybridtrain.cli.main import main

    path = workdir / f"{case.kind}.yaml"
    path.write_bytes(case.content)
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["hybridtrain", "validate", str(path), "--home", str(home)]
    started = time.perf_counter()
    code: int | None = 0
    tb = None
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - the tally counts what escaped, whatever it is
        import traceback

        code, tb = None, "".join(traceback.format_exception(exc))
    finally:
        sys.argv = argv
    text = out.getvalue() + err.getvalue()
    if tb is None and "Traceback (most recent call last)" in text:
        tb = text
    return Outcome(code, tb, time.perf_counter() - started, text)


def run_isolated(case: Case, workdir: Path, home: Path = ROOT, memory_mb: int = 2048) -> Outcome:
    """``run_validate`` in a child process capped at ``memory_mb`` of address space and 60 s."""
    import resource
    import subprocess

    path = workdir / f"{case.kind}.yaml"
    path.write_bytes(case.content)
    cap = memory_mb << 20
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from hybridtrain.cli.main import main; "
             "sys.argv = ['hybridtrain', 'validate', *sys.argv[1:]]; main()", str(path), "--home", str(home)],
            capture_output=True, text=True, timeout=60,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    except subprocess.TimeoutExpired:
        return Outcome(None, "timed out after 60 s", time.perf_counter() - started, "")
    text = proc.stdout + proc.stderr
    tb = text if "Traceback (most recent call last)" in text or proc.returncode < 0 else None
    return Outcome(proc.returncode, tb or (f"exit {proc.returncode}" if proc.returncode not in (0, 2) else None),
                   time.perf_counter() - started, text)


def tally(cases: list[Case], workdir: Path, *, must_fail: bool) -> dict[str, int]:
    counts = {"tried": 0, "clear error": 0, "accepted": 0, "traceback": 0, "wrongly accepted": 0, "over 2 s": 0}
    for case in cases:
        o = run_isolated(case, workdir) if case.isolate else run_validate(case, workdir)
        counts["tried"] += 1
        if o.seconds > 2 and not case.isolate:  # an isolated case's time includes a fresh interpreter
            counts["over 2 s"] += 1
        if o.traceback is not None or o.exit_code not in (0, 2):
            counts["traceback"] += 1
            print(f"  TRACEBACK/exit {o.exit_code}: {case.kind} {case.name}: "
                  f"{(o.traceback or o.output).strip().splitlines()[-1][:160]}", file=sys.__stderr__)
        elif o.exit_code == 2:
            counts["clear error"] += 1
        else:
            counts["accepted"] += 1
            if must_fail:
                counts["wrongly accepted"] += 1
                print(f"  WRONGLY ACCEPTED: {case.kind} {case.name}", file=sys.__stderr__)
    return counts


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=600)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        hostile = tally(must_refuse(), Path(tmp), must_fail=True)
        rnd = tally(list(random_mutations(args.random)), Path(tmp), must_fail=False)
    print(f"must-refuse corpus: {hostile}")
    print(f"random mutations:   {rnd}")
    print(f"config_fuzz: {hostile['traceback'] + rnd['traceback']} tracebacks, {hostile['wrongly accepted']} wrongly "
          f"accepted of {hostile['tried'] + rnd['tried']} tried (target 0)")


if __name__ == "__main__":
    _main()
