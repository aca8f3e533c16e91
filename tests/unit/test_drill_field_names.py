"""The drill's refusals name each input as its caller does: the CLI's flags, the failover-drill flow's form fields;
``steps`` has an upper bound (a huge value ran out of memory after the drill had started)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hybridtrain.drill.runner import CLI_NAMES, FLOW_NAMES, MAX_STEPS, check_drill, option_problems
from hybridtrain.errors import SpecError
from hybridtrain.workspace import Workspace
from orchestration.cli import app


def messages(problems) -> dict[str, str]:
    return {p.path: p.message for p in problems}


def test_the_flows_fields_are_named_as_its_form_names_them(workspace):
    with pytest.raises(SpecError) as raised:
        check_drill(Workspace.resolve(workspace), ["nope"], steps=-5, interval=0, names=FLOW_NAMES)
    assert raised.value.source == "failover-drill"
    found = messages(raised.value.problems)
    assert found == {"scenarios": found["scenarios"], "steps": "-5 is too few; give at least 40 (default 300)",
                     "interval": "must be at least 2 steps, got 0"}
    assert found["scenarios"].startswith("unknown drill scenario 'nope'; choose one of: kill-9")
    assert "--" not in str(raised.value) and "hybridtrain drill" not in str(raised.value)
    assert not (workspace / ".hybridtrain").exists()


def test_an_interval_without_room_for_a_fault_names_the_fields_in_the_forms_words():
    found = messages(option_problems(None, steps=60, interval=30, names=FLOW_NAMES))
    assert found == {"interval": "a checkpoint every 30 steps leaves no room for a fault in a run of 60 steps (fault "
                                 "at 75, then one more interval); use interval=5 or more steps"}
    cli = messages(option_problems(None, steps=60, interval=30, names=CLI_NAMES))
    assert cli["--interval"].endswith("use --interval 5 or more --steps")  # the CLI's message, unchanged


@pytest.mark.parametrize("names, field", [(FLOW_NAMES, "steps"), (CLI_NAMES, "--steps")])
def test_steps_have_an_upper_bound(names, field):
    found = messages(option_problems(["kill-9"], steps=10**12, names=names))
    assert found == {field: f"{10**12} is too many; give at most {MAX_STEPS} (default 300)"}
    assert option_problems(["kill-9"], steps=MAX_STEPS, names=names) == []


def test_the_cli_refuses_too_many_steps_in_one_line_before_anything_is_made(workspace):
    result = CliRunner().invoke(app, ["drill", "--steps", "1000000000000", "--scenario", "kill-9",
                                      "--home", str(workspace)])
    assert result.exit_code == 2, result.output
    assert "--steps: 1000000000000 is too many; give at most 10000" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (workspace / ".hybridtrain").exists()
