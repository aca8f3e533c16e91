"""`hybridtrain serve` and `hybridtrain canary` as users run them (the CLI in a subprocess) with what they get wrong.

A workspace with v1-v3 registered, v2 champion and released to every target, v3 in the bundle archive. Every
mistake — an option out of range, a key that is not a key, a pointer edited on the target, a target path that is
a file — is one error naming the option, argument or file and the fix, a non-zero exit, no traceback, and nothing
written anywhere. A server stopped with SIGTERM (``kill``, a supervisor) removes its status from the target.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.stages.promotion import releaser_for
from hybridtrain.tracking.model_registry import Registry
from hybridtrain.workspace import Workspace
from tests.fixtures.record_models import MODEL, register_version, release_bundle
from tests.fixtures.workspaces import make_workspace

START_TIMEOUT_S = 120
SPEC = ("--spec", "jobs/churn.yaml")
ONPREM = Path(".hybridtrain/serving/onprem")  # onprem-serving's directory, as jobs/churn.yaml names it
POINTER = ONPREM / "current" / f"{MODEL}.json"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("serving-cli") / "ws")
    ws = Workspace.resolve(root)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    v1, v2, v3 = (register_version(registry, seed=s, champion=False) for s in range(3))
    registry.move_champion(MODEL, v2)
    key = SigningKey.generate()
    ws.release_public_key.parent.mkdir(parents=True, exist_ok=True)
    ws.release_public_key.write_bytes(key.public.to_pem())
    bundles = tmp_path_factory.mktemp("bundles")
    releaser = releaser_for(ws, load_spec(root / "jobs" / "churn.yaml"), ws.load_sites(), key.public)
    record = releaser.publish(release_bundle(registry, v2, bundles / v2, key))
    registry.set_version_tags(MODEL, v2, record.tags())  # as promotion does: `--model` finds the targets there
    releaser.archive.put(release_bundle(registry, v3, bundles / v3, key))
    assert (v1, v2, v3) == ("1", "2", "3")
    return root


@pytest.fixture
def root(base, tmp_path) -> Path:
    """A copy of the workspace per test: a test may break its target."""
    return Path(shutil.copytree(base, tmp_path / "ws", symlinks=True))


def hybridtrain(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args, "--home", str(root)],
                          check=False, capture_output=True, text=True, timeout=START_TIMEOUT_S)


def state(root: Path) -> dict[str, bytes | None]:
    """Every file and directory under .hybridtrain but MLflow's database: targets, archive, audit log, caches."""
    top = root / ".hybridtrain"
    return {str(p.relative_to(top)): (p.read_bytes() if p.is_file() else None) for p in sorted(top.rglob("*"))
            if p.relative_to(top).parts[0] != "mlflow"}


def refused(root: Path, *args: str, status: int = 2) -> list[str]:
    """Run a command that must be refused without writing anything; its problem lines."""
    before = state(root)
    out = hybridtrain(root, *args)
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert state(root) == before, "a refused command wrote to the workspace"
    return out.stderr.splitlines()


def problem(lines: list[str], option: str) -> str:
    found = [line for line in lines if line.lstrip().startswith(f"- {option}: ")]
    assert len(found) == 1, (option, lines)
    return found[0]


# -- canary ---------------------------------------------------------------------------------------


def test_a_canary_refused_for_its_share_releases_nothing(root):
    lines = refused(root, "canary", "onprem-serving", "3", "--share", "0", *SPEC)
    assert lines[0] == "error: canary: 1 problem found; fix and re-run:"
    assert "0.0 is out of range; give a number > 0 and < 1" in problem(lines, "--share")
    assert not (root / ONPREM / "released" / MODEL / "3.json").exists()
    assert not (root / ONPREM / "versions" / MODEL / "3").exists()


def test_every_bad_canary_option_is_reported_and_nan_is_not_a_number(root):
    lines = refused(root, "canary", "onprem-serving", "3", "--share", "nan", "--min-requests", "1",
                    "--max-p99-ratio", "inf", "--max-score-ks", "2", *SPEC)
    assert lines[0] == "error: canary: 4 problems found; fix and re-run:"
    assert "nan is not a number; give a number > 0 and < 1" in problem(lines, "--share")
    assert "1 is out of range; give a whole number >= 10" in problem(lines, "--min-requests")
    assert "inf is not a finite number; give a number > 0" in problem(lines, "--max-p99-ratio")
    assert "2.0 is out of range; give a number > 0 and <= 1" in problem(lines, "--max-score-ks")


@pytest.mark.parametrize("version", ["", "3 ", "../1"])
def test_a_version_argument_that_is_not_a_version_is_named(root, version):
    lines = refused(root, "canary", "onprem-serving", version, *SPEC)
    assert lines[0].startswith("error: canary: ")
    assert f"{version!r} is not a version" in problem(lines, "VERSION")


def test_canary_errors_name_the_command_and_an_unknown_model_lists_the_registered_ones(root):
    lines = refused(root, "canary", "nosuch-target", "3", *SPEC)
    assert lines[0].startswith("error: canary: ")
    assert "its targets: onprem-serving, cloud-serving" in problem(lines, "nosuch-target")
    lines = refused(root, "canary", "onprem-serving", "3", "--model", "nosuch")
    assert lines[0].startswith("error: canary: ")
    assert problem(lines, "--model").endswith(f"no model 'nosuch' is registered; registered models: {MODEL}")


def test_a_canary_with_a_directory_as_public_key_names_the_option(root, tmp_path):
    lines = refused(root, "canary", "onprem-serving", "3", "--public-key", str(tmp_path), *SPEC)
    assert f"{tmp_path} is a directory; give the PEM public key" in problem(lines, "--public-key")


# -- serve: options -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (["--poll", "-1", "--threads", "-3", "--port", "70000", "--host", ""],
     {"--poll": "-1.0 is not a polling interval", "--threads": "-3 is not a thread count",
      "--port": "70000 is not a port", "--host": "empty; give 127.0.0.1"}),
    (["--poll", "0", "--port", "-1", "--host", "256.1.1.1"],
     {"--poll": "0.0 is not a polling interval", "--port": "-1 is not a port",
      "--host": "'256.1.1.1' is not an address or a name that resolves"}),
    (["--poll", "nan", "--host", "nosuch.invalid"],
     {"--poll": "nan is not a polling interval", "--host": "'nosuch.invalid' is not an address or a name"}),
    (["--host", "8.8.8.8", "--port", "0"], {"--host": "8.8.8.8 is not an address of this machine"}),
], ids=["negative", "zero-and-bad-address", "nan-and-unresolvable", "not-this-machine"])
def test_serve_options_that_cannot_work_are_each_named(root, args, expected):
    lines = refused(root, "serve", "onprem-serving", *SPEC, *args)
    n = len(expected)
    assert lines[0] == f"error: serve: {n} problem{'s' if n > 1 else ''} found; fix and re-run:"
    for option, text in expected.items():
        assert text in problem(lines, option)


def test_serve_with_a_directory_as_public_key_names_the_option_not_the_port(root, tmp_path):
    lines = refused(root, "serve", "onprem-serving", *SPEC, "--port", "0", "--public-key", str(tmp_path))
    assert f"{tmp_path} is a directory; give the PEM public key" in problem(lines, "--public-key")
    assert "--port" not in "\n".join(lines)


# -- serve: what is on the target -----------------------------------------------------------------


@pytest.mark.parametrize("pointer, why", [
    ('{"model": "churn', "Invalid JSON"),
    ("junk\n", "Invalid JSON"),
    (f'{{"model": "{MODEL}", "version": "../../x", "manifest_sha256": "a", "updated_at": "x"}}',
     "'../../x' is not a version"),
], ids=["truncated", "junk", "path-as-version"])
def test_serve_names_a_current_pointer_that_is_not_one(root, pointer, why):
    (root / POINTER).write_text(pointer)
    lines = refused(root, "serve", "onprem-serving", *SPEC, "--port", "0", status=9)
    assert len(lines) == 1, lines
    assert f"current pointer {root / POINTER} is unreadable (" in lines[0] and why in lines[0]
    assert "release a version there again" in lines[0]


def test_serve_says_a_target_path_that_is_a_file_is_not_a_directory(root):
    shutil.rmtree(root / ONPREM)
    (root / ONPREM).write_text("not a directory\n")
    lines = refused(root, "serve", "onprem-serving", *SPEC, "--port", "0")
    assert f"the target's path {root / ONPREM} is a file, not a directory" in problem(lines, "onprem-serving")


# -- serve: stopping ------------------------------------------------------------------------------


def lines_of(stream) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in stream], daemon=True).start()
    return lines


def next_line(lines: queue.Queue[str], match, what: str, timeout: float = START_TIMEOUT_S) -> str:
    """The next line for which ``match`` is true, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line with {what} in {timeout:g} s") from None
        if match(line):
            return line


def test_serve_survives_a_pointer_edited_under_it_and_sigterm_removes_its_status(root):
    status_dir = root / ONPREM / "serving" / MODEL
    proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "serve", "onprem-serving", *SPEC, "--port",
                             "0", "--poll", "0.2", "--home", str(root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out, err = lines_of(proc.stdout), lines_of(proc.stderr)
    try:
        first = next_line(out, bool, "`hybridtrain serve`'s first line")
        assert first.startswith(f"serving {MODEL} v2 from onprem-serving at "), first
        assert len(list(status_dir.glob("onprem-dc1-*.json"))) == 1

        good = (root / POINTER).read_bytes()
        (root / POINTER).write_text('{"model": "churn')  # cut short under a running server: it keeps serving
        warning = next_line(err, lambda line: "is unreadable" in line, "a warning about the edited pointer")
        assert f"current pointer {root / POINTER}" in warning and warning.rstrip().endswith("still serving")
        (root / POINTER).write_bytes(good)
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(status_dir.glob("*.json")) == [], "the stopped server's status was left on the target"
    rest = []
    while not err.empty():
        rest.append(err.get())
    assert not any("Traceback" in line for line in rest), "".join(rest)
