"""The data stage flows refuse what a Prefect UI user can type into their forms, before any work.

sync-data: the tier of ``approved`` is the workspace's (prepare-data's tier promotion in the audit
log), never the caller's, so a form that says ``tier: approved`` of the raw CSV moves nothing.
prepare-data and sync-data: a ``run_id`` that names no MLflow run is refused before the data is
touched (a stage flow belongs to a training-lifecycle run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridtrain.errors import SpecError
from tests.fixtures.workspaces import build_workspace, spec_writer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(prefect_server, pseudonym_key, tmp_path_factory):
    from flows.data import prepare_data
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec
    from hybridtrain.workspace import Workspace

    root = build_workspace(tmp_path_factory.mktemp("sync-refusals") / "ws", rows=2500)
    ws = Workspace.resolve(root)
    spec = load_spec(spec_writer(root)("refusals", metadata__name="refusals", placement__site=None))
    run_id = stages.open_run(ws, spec, None)
    prepared = prepare_data(spec=spec, run_id=run_id, workspace=str(root))
    return {"root": root, "ws": ws, "spec": spec, "run_id": run_id, "prepared": prepared}


def store_files(root: Path, site: str) -> set[Path]:
    store = root / ".hybridtrain" / "stores" / site
    return {p for p in store.rglob("*") if p.is_file()} if store.exists() else set()


def audit_records(ws, action: str) -> list:
    from hybridtrain import stages

    return [r for r in stages.audit(ws).records() if r.action == action]


def only_problem(exc: SpecError):
    assert len(exc.problems) == 1, str(exc)
    return exc.problems[0]


def test_a_forged_approved_version_of_the_raw_csv_is_refused_and_nothing_leaves(env):
    from flows.data import sync_data
    from hybridtrain.datasets.dvc_repo import DatasetVersion

    root, ws, spec = env["root"], env["ws"], env["spec"]
    raw = env["prepared"].prep.raw
    approved_md5 = env["prepared"].anon.approved.md5
    forged = [  # what QA typed into the sync-data form: the raw CSV, declared approved
        (DatasetVersion(path=raw.path, md5=raw.md5, size=1, tier="approved", site="onprem-dc1"), "its tier is raw"),
        # the raw bytes under the approved tier's path
        (DatasetVersion(path="data/approved/refusals", md5=raw.md5, size=1, tier="approved", site="onprem-dc1"),
         "its tier is raw"),
        # an approved md5 under another path
        (DatasetVersion(path=raw.path, md5=approved_md5, size=1, tier="approved", site="onprem-dc1"),
         "this content was approved as data/approved/refusals"),
    ]
    before_files, before_syncs = store_files(root, "cloud-eu"), audit_records(ws, "sync")
    for approved, why in forged:
        with pytest.raises(SpecError) as caught:
            sync_data(approved=approved, destination="cloud-eu", run_id=env["run_id"], spec=spec,
                      workspace=str(root))
        problem = only_problem(caught.value)
        assert problem.path == "approved", str(caught.value)
        assert "is not an approved dataset version of this workspace" in problem.message, str(caught.value)
        assert why in problem.message, str(caught.value)
        assert "only versions made by prepare-data may be synced" in problem.message, str(caught.value)
    assert store_files(root, "cloud-eu") == before_files  # not one object was pushed
    assert audit_records(ws, "sync") == before_syncs  # and no sync was audited
    assert not any(raw.md5 in r.subject for r in audit_records(ws, "sync"))


def test_the_raw_version_is_named_with_its_recorded_tier(env):
    from hybridtrain import stages
    from hybridtrain.datasets.dvc_repo import DatasetVersion

    raw = env["prepared"].prep.raw
    forged = DatasetVersion(path=raw.path, md5=raw.md5, size=1, tier="approved", site="onprem-dc1")
    with pytest.raises(SpecError) as caught:
        stages.sync(env["ws"], forged, "cloud-eu", env["spec"])
    message = only_problem(caught.value).message
    assert f"{raw.path}@{raw.md5[:8]} is not an approved dataset version" in message
    assert "its tier is raw: raw data may not leave site onprem-dc1" in message


def test_sync_needs_the_spec_for_the_policy_check(env):
    from hybridtrain import stages

    before = store_files(env["root"], "cloud-eu")
    with pytest.raises(SpecError) as caught:
        stages.sync(env["ws"], env["prepared"].anon.approved, "cloud-eu", None)
    assert only_problem(caught.value).path == "spec"
    assert store_files(env["root"], "cloud-eu") == before


def test_an_approved_version_claimed_at_a_site_that_does_not_hold_it_is_refused(env):
    from hybridtrain import stages

    approved = env["prepared"].anon.approved
    before = store_files(env["root"], "onprem-dc1")
    with pytest.raises(SpecError) as caught:  # cloud-eu never received it, so it cannot send it
        stages.sync(env["ws"], approved.at("cloud-eu"), "onprem-dc1", env["spec"])
    problem = only_problem(caught.value)
    assert problem.path == "approved" and "is not held by site cloud-eu" in problem.message
    assert store_files(env["root"], "onprem-dc1") == before


def test_a_bad_run_id_is_refused_before_prepare_data_does_any_work(env):
    from flows.data import prepare_data
    from hybridtrain.specs.job import load_spec

    root, ws = env["root"], env["ws"]
    spec = load_spec(spec_writer(root)("runless", metadata__name="runless", placement__site=None))
    promotions = audit_records(ws, "tier_promotion")
    for run_id in ("no-such-run", ""):
        with pytest.raises(SpecError) as caught:
            prepare_data(spec=spec, run_id=run_id, workspace=str(root))
        problem = only_problem(caught.value)
        assert problem.path == "run_id", str(caught.value)
        assert "started by training-lifecycle" in problem.message, str(caught.value)
    assert not (root / "data" / "curated" / "runless").exists()  # nothing preprocessed
    assert not (root / "data" / "approved" / "runless").exists()
    assert audit_records(ws, "tier_promotion") == promotions


def test_a_bad_run_id_is_refused_before_sync_data_moves_anything(env):
    from flows.data import sync_data

    root, ws = env["root"], env["ws"]
    before_files, before_syncs = store_files(root, "cloud-eu"), audit_records(ws, "sync")
    with pytest.raises(SpecError) as caught:
        sync_data(approved=env["prepared"].anon.approved, destination="cloud-eu", run_id="no-such-run",
                  spec=env["spec"], workspace=str(root))
    problem = only_problem(caught.value)
    assert problem.path == "run_id" and "training-lifecycle" in problem.message, str(caught.value)
    assert store_files(root, "cloud-eu") == before_files
    assert audit_records(ws, "sync") == before_syncs


def test_the_version_prepare_data_approved_is_synced_and_audited(env):
    from flows.data import sync_data

    root, ws = env["root"], env["ws"]
    approved = env["prepared"].anon.approved
    before = store_files(root, "cloud-eu")
    forged_size = approved.model_copy(update={"size": 1})  # the size is the workspace's too (the egress cap)
    result = sync_data(approved=forged_size, destination="cloud-eu", run_id=env["run_id"], spec=env["spec"],
                       workspace=str(root))
    assert result.transfer is not None and result.transfer.bytes > 0
    assert result.dataset.md5 == approved.md5 and result.dataset.size == approved.size
    assert result.dataset.site == "cloud-eu" and result.dataset.tier == "approved"
    assert store_files(root, "cloud-eu") > before
    syncs = audit_records(ws, "sync")
    assert syncs[-1].subject == f"dataset {approved.path}@{approved.md5}"
    assert syncs[-1].inputs["destination"] == "cloud-eu"
    from hybridtrain import stages

    # cloud-eu holds it now (the audit log says so), so a sync from there is a sync of an approved version
    back = stages.sync(ws, result.dataset, "onprem-dc1", env["spec"])
    assert back.dataset.site == "onprem-dc1" and back.transfer is not None and back.transfer.source == "cloud-eu"


def test_content_two_jobs_approved_is_synced_under_either_path(env):
    from flows.data import prepare_data, sync_data
    from hybridtrain import stages
    from hybridtrain.specs.job import load_spec

    root, ws = env["root"], env["ws"]
    spec = load_spec(spec_writer(root)("twin", metadata__name="twin", placement__site=None))
    run_id = stages.open_run(ws, spec, None)
    twin = prepare_data(spec=spec, run_id=run_id, workspace=str(root)).anon.approved
    assert twin.md5 == env["prepared"].anon.approved.md5 and twin.path == "data/approved/twin"  # same data, same key
    result = sync_data(approved=twin, destination="cloud-eu", run_id=run_id, spec=spec, workspace=str(root))
    assert result.dataset.path == "data/approved/twin" and result.dataset.site == "cloud-eu"
    assert [r.subject for r in audit_records(ws, "sync")][-1] == f"dataset data/approved/twin@{twin.md5}"
