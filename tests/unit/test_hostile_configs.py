"""Hostile config files: each mistake or attack is one located line and exit 2, in bounded time and memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from hybridtrain.cli.main import app
from hybridtrain.specs.config_file import read_yaml
from tests.fixtures.workspaces import ROOT

runner = CliRunner()
CHURN = (ROOT / "jobs" / "churn.yaml").read_text()
POLICY = (ROOT / "deployments" / "policy.yaml").read_text()
SITES = (ROOT / "deployments" / "sites.yaml").read_text()


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch):
    monkeypatch.setattr(os, "environ", os.environ.copy())


def validate(tmp_path, content: str | bytes, name: str = "spec.yaml"):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return runner.invoke(app, ["validate", str(path), "--home", str(ROOT)])


def spec_with(**changes) -> str:
    data = yaml.safe_load(CHURN)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


def assert_one_clear_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_duplicate_key_is_refused_naming_both_lines(tmp_path):
    text = CHURN.replace("    email: {treatment: pseudonym}\n",
                         "    email: {treatment: pseudonym}\n    email: {treatment: keep, reason: x}\n")
    first = text.splitlines().index("    email: {treatment: pseudonym}") + 1
    result = validate(tmp_path, text)
    assert_one_clear_error(result, "sensitive.columns.email (line", "'email' appears twice", f"lines {first} and {first + 1}")


def test_a_directory_or_a_device_is_not_called_missing(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "churn.yaml").write_text(CHURN)
    result = runner.invoke(app, ["validate", str(tmp_path / "jobs"), "--home", str(ROOT)])
    assert_one_clear_error(result, "is a directory, not a YAML file", "(it holds churn.yaml)")
    result = runner.invoke(app, ["validate", os.devnull, "--home", str(ROOT)])
    assert_one_clear_error(result, "is not a regular file")


def test_binary_file_is_refused_with_a_line(tmp_path):
    result = validate(tmp_path, CHURN.encode()[:200] + b"\n\xff\xfe\x00garbage\n")
    assert_one_clear_error(result, "not UTF-8", "line ")


@pytest.mark.parametrize("content", ['apiVersion: "hybridtrain/v1\\0"\n', "a: b\x00c\n"])
def test_nul_characters_are_refused(tmp_path, content):
    assert_one_clear_error(validate(tmp_path, content), "NUL")


def test_deep_nesting_is_refused_quickly(tmp_path):
    started = time.perf_counter()
    result = validate(tmp_path, "a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert_one_clear_error(result, "nested more than")
    assert time.perf_counter() - started < 2


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    started = time.perf_counter()
    result = validate(tmp_path, "\n".join(lines) + "\n")
    assert_one_clear_error(result, "alias bomb")
    assert time.perf_counter() - started < 2


def test_oversized_file_is_refused(tmp_path):
    assert_one_clear_error(validate(tmp_path, "# " + "x" * (2 << 20) + "\n"), "config files are limited")


@pytest.mark.parametrize(("changes", "needle"), [
    ({"deadline": "99999999999d"}, "deadline"),
    ({"promotion__release_targets__1__prefix": "../x"}, "prefix"),
    ({"promotion__release_targets__0__path": "../../../tmp/evil"}, "release_targets[0].path"),
    ({"placement__strategy": "no-such-strategy"}, "placement.strategy"),
    ({"placement__job_class": "nosuchclass"}, "placement.job_class"),
])
def test_spec_mistakes_are_located(tmp_path, changes, needle):
    assert_one_clear_error(validate(tmp_path, spec_with(**changes)), needle, "(line ")


def test_structural_and_semantic_problems_come_in_one_pass(tmp_path):
    result = validate(tmp_path, spec_with(model__epochs="many", placement__strategy="nope",
                                          dataset__site="mars"))
    assert_one_clear_error(result, "model.epochs", "placement.strategy", "dataset.site")


def test_negative_strategy_option_in_the_policy_is_located(tmp_path):
    text = POLICY.replace("deadline_spot: {max_onprem_wait_hours: 1}", "deadline_spot: {max_onprem_wait_hours: -1}")
    assert_one_clear_error(validate(tmp_path, text, "policy.yaml"), "max_onprem_wait_hours", "(line ")


def test_brackets_in_messages_survive_rich_markup(tmp_path):
    result = validate(tmp_path, spec_with(schema__label="nope"))
    assert_one_clear_error(result)
    result = validate(tmp_path, spec_with(model__hidden_layers=[0]))
    assert "hidden_layers" in result.output


def test_line_index_of_an_alias_heavy_document_is_linear(tmp_path):
    # Under the node bound but with deep sharing: the old index walked every alias path (2**14 here).
    lines = ["l0: &l0 [x, y]"] + [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, 14)]
    path = tmp_path / "shared.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    data, index = read_yaml(path)
    assert len(index) < 1000
    assert time.perf_counter() - started < 2


def test_hostile_files_stay_within_time_and_memory_in_a_subprocess(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    bomb.write_text("\n".join(lines) + "\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(os.urandom(4096))
    script = (
        "import resource, sys\n"
        "from hybridtrain.cli.main import main\n"
        "sys.argv = ['hybridtrain', 'validate', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        # VmHWM, not ru_maxrss: the child is forked from pytest (preexec_fn), and ru_maxrss keeps the parent's
        # peak across exec; VmHWM belongs to the new address space.
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"
        "print('maxrss_kb', hwm)\n"
        "sys.exit(code)\n"
    )
    for path in (bomb, deep, binary):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", script, str(path), "--home", str(ROOT)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        rss_mb = int(proc.stdout.split("maxrss_kb")[1]) / 1024
        # The interpreter with the CLI imported is most of it; the parse itself must add little.
        assert rss_mb < 200, rss_mb
        assert time.perf_counter() - started < 10  # includes interpreter start and imports
