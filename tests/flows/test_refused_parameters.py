"""Wrong parameters, as a Prefect UI user types them, are refused by the flow before it does any work.

Each call below fails naming the parameter (``storage``, ``run_key``, ``spec_path``, ``run_id``,
``parent_run_id``), or ``dataset.md5`` for a wrong pin, and leaves nothing behind: no MLflow run, no
curated or approved dataset version, no audit record. A stage whose attempt fails shows the attempt's
own error even when recording how it ended fails too.
"""

from __future__ import annotations

from uuid import uuid4

import pytest

from hybridtrain.errors import DataError, SpecError
from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow

SWEEP = {"n_trials": 2, "parallelism": 1, "study_name": "refused-sweep",
         "parameters": {"dropout": {"type": "float", "low": 0.0, "high": 0.5}}}


@pytest.fixture(scope="module")
def root(prefect_server, pseudonym_key, tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("refused") / "ws", rows=2500)


@pytest.fixture
def untouched(root):
    """Asserts, after the test, that no MLflow run, dataset version or audit record was made."""
    from hybridtrain import stages
    from hybridtrain.tracking.model_registry import Registry
    from hybridtrain.workspace import Workspace

    ws = Workspace.resolve(root)
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)

    def runs() -> list[str]:
        return [r.info.run_id for r in registry.recent_runs(ws.experiment, 1000)]

    def records() -> int:
        return sum(1 for _ in stages.audit(ws).records())

    before = (runs(), records())
    yield ws
    assert (runs(), records()) == before
    assert not (root / "data" / "curated").exists() and not (root / "data" / "approved").exists()


def failure(flow, **params) -> BaseException:
    state = flow(**params, return_state=True)
    assert state.is_failed(), state
    exc = state.result(raise_on_failure=False)
    assert isinstance(exc, BaseException), exc
    return exc


def problem_at(exc: BaseException, path: str) -> str:
    assert isinstance(exc, SpecError), repr(exc)
    [problem] = exc.problems
    assert problem.path == path, exc
    return problem.message


def test_a_sweep_whose_storage_cannot_be_opened_is_refused_naming_storage(root, untouched):
    from flows.sweep import sweep

    spec = spec_writer(root)("refused-sweep", sweep=SWEEP)
    exc = failure(sweep, spec_path=str(spec), workspace=str(root), storage="nonsense", dispatch="inline")
    message = problem_at(exc, "storage")
    assert "cannot open the study database nonsense" in message and "--storage" not in message


def test_a_lifecycle_run_key_that_leaves_the_store_is_refused_before_anything(root, untouched):
    from flows.lifecycle import lifecycle

    exc = failure(lifecycle, spec_path="jobs/churn.yaml", workspace=str(root), run_key="../../../../tmp/escape",
                  dispatch="inline")
    assert "is not a run key" in problem_at(exc, "run_key")


def test_an_empty_spec_path_says_so(root, untouched):
    from flows.lifecycle import lifecycle

    exc = failure(lifecycle, spec_path="", workspace=str(root), dispatch="inline")
    assert problem_at(exc, "spec_path").startswith("spec_path is empty: give a job spec file under jobs/")


@pytest.mark.parametrize("where", ["/etc/passwd", "../outside.yaml", "jobs/../../outside.yaml"])
def test_a_deployment_run_reads_no_spec_outside_the_workspace(root, untouched, monkeypatch, where):
    from flows.lifecycle import lifecycle

    (root.parent / "outside.yaml").write_text("apiVersion: hybridtrain/v1\n")
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", str(uuid4()))  # as a run of a deployment (the UI form)
    exc = failure(lifecycle, spec_path=where, workspace=str(root), dispatch="inline")
    assert f"{where} is outside the workspace" in problem_at(exc, "spec_path")


def test_a_direct_call_still_reads_the_file_it_names_outside_the_workspace(root, untouched):
    """`hybridtrain run SPEC` and Python callers name files they can read themselves: not refused for where it is."""
    from flows.lifecycle import lifecycle

    outside = root.parent / "outside.yaml"
    outside.write_text("apiVersion: hybridtrain/v1\n")
    exc = failure(lifecycle, spec_path=str(outside), workspace=str(root), dispatch="inline")
    assert isinstance(exc, SpecError) and exc.source == str(outside) and "outside the workspace" not in str(exc)


def test_a_lifecycle_pinning_a_version_that_is_nowhere_is_refused_before_an_mlflow_run(root, untouched):
    from flows.lifecycle import lifecycle

    spec = spec_writer(root)("ghost-pin", dataset__md5="f" * 32)
    exc = failure(lifecycle, spec_path=str(spec), workspace=str(root), dispatch="inline")
    assert isinstance(exc, DataError) and [p.path for p in exc.problems] == ["dataset.md5"]
    assert "set dataset.md5 to" in str(exc)


# -- stage flows started by hand, with ids only a lifecycle or a sweep has ---------------------------------


def dataset():
    from hybridtrain.datasets.dvc_repo import DatasetVersion

    return DatasetVersion(path="data/approved/churn", md5="0" * 32 + ".dir", size=1, tier="approved",
                          site="onprem-dc1")


def job(root):
    from hybridtrain.specs.job import load_spec

    return load_spec(root / "jobs" / "churn.yaml")


def test_a_train_stage_for_no_lifecycle_run_is_refused_naming_run_id(root, untouched):
    from flows.training import train_stage

    exc = failure(train_stage, spec=job(root), approved=dataset(), site="nope", run_id="no-such-run",
                  run_key="k", workspace=str(root))
    assert "no MLflow run 'no-such-run'" in problem_at(exc, "run_id")
    assert "training-lifecycle" in str(exc)


def test_a_sweep_trial_for_no_sweep_run_or_with_a_bad_storage_is_refused_naming_it(root, untouched):
    from flows.sweep import sweep_trial
    from hybridtrain.sweeps.study import TrialTicket
    from hybridtrain.tracking.model_registry import Registry

    params = {"spec": job(root), "approved": dataset(), "site": "onprem-dc1", "study": "s",
              "ticket": TrialTicket(number=0, trial_id=0, params={}), "workspace": str(root)}
    exc = failure(sweep_trial, parent_run_id="no-such-run", storage="nonsense", **params)
    assert "hyperparameter-sweep" in problem_at(exc, "parent_run_id")
    ws = untouched
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    parent = registry.start_run("refused-parameters", run_name="sweep", tags={})  # not the lifecycle experiment
    exc = failure(sweep_trial, parent_run_id=parent, storage="nonsense", **params)
    assert "cannot open the study database nonsense" in problem_at(exc, "storage")
    assert [f.path for f in registry.client.list_artifacts(parent)] == []


@pytest.mark.parametrize("flow_name", ["federated_prepare", "federated_round", "federated_evaluate"])
def test_a_federated_step_for_no_lifecycle_run_or_with_a_bad_run_key_is_refused(root, untouched, flow_name):
    import flows.federated

    flow = getattr(flows.federated, flow_name)
    params = {"spec": job(root), "site": "onprem-dc1", "aggregation_site": "onprem-dc1", "tag": "t",
              "workspace": str(root)}
    if flow_name != "federated_prepare":
        params.update(rnd=1, approved=dataset(), featurizer={})
    exc = failure(flow, run_id="no-such-run", run_key="fed-1", **params)
    assert "no MLflow run 'no-such-run'" in problem_at(exc, "run_id")
    exc = failure(flow, run_id="no-such-run", run_key="../fed", **params)
    assert "is not a run key" in problem_at(exc, "run_key")


def test_an_attempt_s_own_error_wins_when_its_end_cannot_be_recorded(root, untouched, monkeypatch):
    """MLflow stops answering while a failed attempt records how it ended: the run shows the attempt's error."""
    from mlflow.exceptions import MlflowException

    from flows.training import train_stage
    from hybridtrain import stages
    from hybridtrain.tracking.model_registry import Registry

    ws = untouched
    run_id = Registry(ws.tracking_uri, ws.mlflow_artifacts).start_run("refused-parameters", run_name="lc", tags={})

    def unreachable(*args, **kwargs):
        raise MlflowException("API request to endpoint /api/2.0/mlflow-artifacts failed: connection refused")

    monkeypatch.setattr(stages, "save_result", unreachable)
    exc = failure(train_stage, spec=job(root), approved=dataset(), site="nope", run_id=run_id, run_key="k",
                  workspace=str(root))
    assert isinstance(exc, SpecError) and "no site named 'nope'" in str(exc), repr(exc)
