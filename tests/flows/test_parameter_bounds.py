"""A number out of range in a deployment's run form is refused by the Prefect server when the run is created.

A flow run stored with a number beyond 64 bits (``99999999999999999999``; on PostgreSQL also ``1e308``, which it
keeps as a 309-digit integer) makes every later flow-run listing of the server answer 500, the UI's run list
included, until the run is deleted (PrefectHQ/prefect#15031); the flow's own check runs too late, the run exists by
then. The deployed flows' numbers carry their bounds in their types, so the deployments' parameter schemas have
them and the server refuses such a run (409, naming the parameter): no run is created. Deployed as ``hybridtrain
deploy`` deploys them (``prefect deploy`` of deployments/prefect.yaml); no worker: runs are created and read back.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.fixtures.workspaces import ROOT, make_workspace

pytestmark = pytest.mark.slow

DEPLOYMENTS = {  # deployment -> its work pool
    "burst-controller/control": "control",
    "recover-runs/control": "control",
    "failover-drill/weekly": "onprem",
    "serve-model/onprem-serving": "onprem",
    "training-lifecycle/churn-from-cloud-pool": "cloud",  # the spec form: numbers nested in a model
}

#: ``prefect deploy --name`` matches a deployment by its entrypoint function's name, with ``-`` for ``_``
#: (``lifecycle``), not by the flow's name (``training-lifecycle``), which the API reads it by.
DEPLOY_AS = {"training-lifecycle/churn-from-cloud-pool": "lifecycle/churn-from-cloud-pool"}

REFUSED = [  # deployment, parameters, the parameter the refusal names
    ("burst-controller/control", {"interval_s": 1e308}, "interval_s"),
    ("burst-controller/control", {"interval_s": 99999999999999999999}, "interval_s"),
    ("burst-controller/control", {"interval_s": 86401}, "interval_s"),
    ("burst-controller/control", {"interval_s": 0}, "interval_s"),
    ("recover-runs/control", {"heartbeat_timeout_s": 1e308}, "heartbeat_timeout_s"),
    ("recover-runs/control", {"heartbeat_timeout_s": 30}, "heartbeat_timeout_s"),
    ("recover-runs/control", {"lookback_hours": 99999999999999999999}, "lookback_hours"),
    ("failover-drill/weekly", {"steps": 1000000000000}, "steps"),
    ("failover-drill/weekly", {"interval": 99999999999999999999}, "interval"),
    ("failover-drill/weekly", {"interval": 0}, "interval"),
    ("serve-model/onprem-serving", {"port": 70000}, "port"),
    ("serve-model/onprem-serving", {"poll_s": 1e308}, "poll_s"),
    ("training-lifecycle/churn-from-cloud-pool", {"spec": ("resources", "max_hours", 1e308)}, "max_hours"),
    ("training-lifecycle/churn-from-cloud-pool", {"spec": ("model", "batch_size", 99999999999999999999)}, "batch_size"),
]

ACCEPTED = [  # the bounds themselves
    ("burst-controller/control", {"interval_s": 86400}),
    ("recover-runs/control", {"heartbeat_timeout_s": 90, "lookback_hours": 168}),
    ("failover-drill/weekly", {"steps": 10000, "interval": 2}),
    ("serve-model/onprem-serving", {"port": 0, "poll_s": 0.05}),
]


@pytest.fixture(scope="module")
def deployed(prefect_server, tmp_path_factory):
    """The deployments above, applied from deployments/prefect.yaml by ``prefect deploy``: name -> id.

    Those (and pools) this fixture created are deleted afterwards; ones another test file deployed stay."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    root = make_workspace(tmp_path_factory.mktemp("bounds") / "ws")
    for pkg in ("flows", "tasks", "blocks", "workers", "hybridtrain", "orchestration"):  # this checkout's code
        (root / pkg).symlink_to(ROOT / pkg, target_is_directory=True)
    made_pools, existing = [], set()
    with get_client(sync_client=True) as client:
        for pool in sorted(set(DEPLOYMENTS.values())):
            try:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
                made_pools.append(pool)
            except ObjectAlreadyExists:
                pass
        for name in DEPLOYMENTS:
            try:
                client.read_deployment_by_name(name)
                existing.add(name)
            except ObjectNotFound:
                pass
    out = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml",
         *(arg for name in DEPLOYMENTS for arg in ("--name", DEPLOY_AS.get(name, name)))],
        check=False, cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PREFECT_API_URL": prefect_server, "HYBRIDTRAIN_HOME": str(root)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with get_client(sync_client=True) as client:
        try:
            ids = {name: client.read_deployment_by_name(name).id for name in DEPLOYMENTS}
        except ObjectNotFound:
            pytest.fail(out.stdout[-6000:] + out.stderr[-3000:])
    yield ids
    with get_client(sync_client=True) as client:
        for name, dep in ids.items():
            if name not in existing:
                client.delete_deployment(dep)
        for pool in made_pools:
            client.delete_work_pool(pool)


def form(params: dict) -> dict:
    """The parameters as the form sends them: a ``spec`` given as (section, field, value) is jobs/churn.yaml's spec
    with that one number changed (``specs.schema_bounds`` bounds the numbers nested in it)."""
    if not isinstance(params.get("spec"), tuple):
        return params
    section, key, value = params["spec"]
    spec = yaml.safe_load((ROOT / "jobs" / "churn.yaml").read_text())
    spec[section][key] = value
    return {**params, "spec": spec}


def shown(params: dict, field: str) -> str:
    value = params["spec"][2] if isinstance(params.get("spec"), tuple) else params[field]
    return f"{value:g}"


def runs_of(client, deployment) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment])))


def test_the_deployments_enforce_their_schema_and_it_has_the_bounds(deployed):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployments = {name: client.read_deployment(dep) for name, dep in deployed.items()}
    assert all(d.enforce_parameter_schema for d in deployments.values())
    props = deployments["burst-controller/control"].parameter_openapi_schema["properties"]
    assert (props["interval_s"]["exclusiveMinimum"], props["interval_s"]["maximum"]) == (0, 86400)
    props = deployments["serve-model/onprem-serving"].parameter_openapi_schema["properties"]
    assert (props["port"]["minimum"], props["port"]["maximum"]) == (0, 65535)


@pytest.mark.parametrize("deployment, params, field", REFUSED,
                         ids=[f"{d.split('/')[0]}-{f}={shown(v, f)}" for d, v, f in REFUSED])
def test_an_out_of_range_number_is_refused_when_the_run_is_created(deployed, deployment, params, field):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    dep = deployed[deployment]
    with get_client(sync_client=True) as client:
        before = {r.id for r in runs_of(client, dep)}
        with pytest.raises(PrefectHTTPStatusError) as refused:
            run = client.create_flow_run_from_deployment(dep, parameters=form(params))
            client.delete_flow_run(run.id)  # stored (the old behaviour): gone before it breaks the server's listings
        assert refused.value.response.status_code == 409
        detail = refused.value.response.json()["detail"]
        assert detail.startswith("Error creating flow run: Validation failed for field '"), detail
        assert f"{field}'" in detail.splitlines()[0], detail  # named (Prefect names a nested one by its path)
        # No run was created, and the server still lists runs (a stored 1e308 would make this answer 500).
        assert not [r for r in runs_of(client, dep) if r.id not in before]
        client.read_flow_runs(limit=5)


@pytest.mark.parametrize("deployment, params", ACCEPTED, ids=[d.split("/")[0] for d, _ in ACCEPTED])
def test_a_number_at_its_bound_is_accepted(deployed, deployment, params):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployed[deployment], parameters=params)
        try:
            got = client.read_flow_run(run.id)
            assert {k: got.parameters[k] for k in params} == params
            assert run.id in {r.id for r in runs_of(client, deployed[deployment])}
        finally:
            client.delete_flow_run(run.id)  # never started: no worker polls these pools here
