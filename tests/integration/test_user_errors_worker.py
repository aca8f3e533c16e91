"""Wrong parameters typed in the Prefect UI, run by a real process worker: the run fails with its error as one
ERROR line of its log naming the form's field, and no traceback (``orchestration.user_errors``).

As the QA of deployment parameters ran them: deployed from prefect.yaml, started with ``prefect deployment run
--param``, executed by ``prefect worker start --pool onprem``; the log read back from the API, as the UI reads it.
Numbers outside their bounds (``steps=1000000000000``, ``port=70000``) never get that far: the server refuses the
run when it is created (tests/flows/test_parameter_bounds.py), so the wrong values run here are ones only the flow
can judge, and the refusal of the others is checked as ``prefect deployment run`` reports it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridtrain.drill.processes import stop_with_children
from tests.fixtures.processes import start_worker, wait_for_workers, wait_until
from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = pytest.mark.slow
RUNS = {  # deployment, its --param arguments, the one ERROR line its run's log must have
    "drill": ("failover-drill/weekly", ["--param", 'scenarios=["nope"]', "--param", "interval=5000"],
              ("failover-drill: 2 problems found; fix and re-run:\n"
               "  - scenarios: unknown drill scenario 'nope'; choose one of: kill-9, preempt, corrupt-checkpoint, "
               "s3-down, ssh-down\n"
               "  - interval: a checkpoint every 5000 steps leaves no room for a fault in a run of 300 steps (fault at "
               "12500, then one more interval); use interval=25 or more steps")),
    "serve": ("serve-model/onprem-serving", ["--param", "target= "],
              ("serve-model: 1 problem found; fix and re-run:\n"
               "  - target: empty; give the name of one of the model's release targets "
               "(promotion.release_targets[].name in the job spec)")),
}
OUT_OF_RANGE = {  # deployment, its --param arguments, the field the server's refusal names
    "drill": ("failover-drill/weekly", ["--param", "steps=1000000000000"], "steps"),
    "serve": ("serve-model/onprem-serving", ["--param", "port=70000"], "port"),
}


def prefect(api: str, root: Path, *args: str, ok: bool = True) -> str:
    out = subprocess.run([sys.executable, "-m", "prefect", *args], check=False, cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PREFECT_API_URL": api, "HYBRIDTRAIN_HOME": str(root)})
    assert (out.returncode == 0) == ok, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout + out.stderr


def finished_log(client, run_id: str) -> list | None:
    """The run's log (oldest first) once its last line, Prefect's ``Finished in state``, has arrived."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
                            sort=LogSort.TIMESTAMP_ASC)
    return logs if any("Finished in state" in entry.message for entry in logs) else None


def test_a_worker_run_with_wrong_parameters_logs_one_line_naming_them(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from deployments.bootstrap import bootstrap
    from hybridtrain.workspace import Workspace

    root = make_workspace(tmp_path / "ws")
    for pkg in ("flows", "tasks", "blocks", "workers", "hybridtrain", "orchestration"):  # this checkout's code
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    bootstrap(Workspace.resolve(root), deploy=False)  # pools and blocks, as `make deploy`
    prefect(prefect_server, root, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml",
            *(arg for deployment, _, _ in RUNS.values() for arg in ("--name", deployment)))
    for deployment, params, field in OUT_OF_RANGE.values():  # refused by the server: no run to execute
        out = prefect(prefect_server, root, "deployment", "run", deployment, *params, ok=False)
        assert f"Validation failed for field '{field}'" in " ".join(out.split()), out[-2000:]
    log = tmp_path / "worker-onprem.log"
    worker = start_worker("onprem", root, prefect_server, log)
    try:
        wait_for_workers(["onprem"], [worker], [log])
        run_ids = {}
        for name, (deployment, params, _) in RUNS.items():
            out = prefect(prefect_server, root, "deployment", "run", deployment, *params)
            run_ids[name] = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
        with get_client(sync_client=True) as client:
            for name, (_, _, line) in RUNS.items():
                state = wait_until(lambda name=name: (s := client.read_flow_run(run_ids[name]).state).is_final() and s,
                                   f"the {name} run to end", timeout=180, every=0.5)
                assert state.is_failed(), (state, log.read_text()[-3000:])
                logs = wait_until(lambda name=name: finished_log(client, run_ids[name]),
                                  f"the {name} run's last log line", timeout=60, every=0.5)
                assert [e.message for e in logs if e.level >= logging.ERROR] == [line], name
                assert not any("Traceback" in e.message for e in logs), name
        assert not (root / ".hybridtrain" / "drills").exists()
    finally:
        stop_with_children(worker)
