"""The promote stage (hybridtrain.stages.promotion) stopped part-way — Ctrl-C, kill -9 — and the same lifecycle run
again (`hybridtrain run SPEC --run-key KEY`: a new MLflow run that resumes from the final checkpoint, so the same
model): the re-run finishes the interrupted promotion of the version already registered instead of registering
another, and the registry keeps no unexplained version. Real MLflow (SQLite), real bundles, real release targets."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.governance.audit_log import AuditLog
from hybridtrain.governance.promotion import PROMOTE_PENDING_TAG, PROMOTION_TAG, STATUS_TAG
from hybridtrain.governance.release import BundleArchive
from hybridtrain.governance.signing_key import SigningKey
from hybridtrain.specs.job import load_spec
from hybridtrain.stages.results import EvaluateResult, TrainOutput
from hybridtrain.tracking.lineage import Lineage
from hybridtrain.tracking.model_registry import CHAMPION, PREVIOUS, Registry
from hybridtrain.workspace import Workspace
from orchestration.cli import app
from tests.fixtures.record_models import MODEL, fitted
from tests.fixtures.workspaces import make_workspace

SITE = "onprem-dc1"
PEM = SigningKey.generate().to_pem().decode()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, arriving right after a given call."""


class Lifecycle:
    """One workspace and what a lifecycle run hands the promote stage: a model trained (logged into its own MLflow
    run), its lineage and its evaluation."""

    def __init__(self, root: Path):
        self.root = root
        self.ws = Workspace.resolve(root)
        self.spec = load_spec(root / "jobs" / "churn.yaml")
        self.registry = Registry(self.ws.tracking_uri, self.ws.mlflow_artifacts)

    def promote(self, run_key: str, *, seed: int = 0, checkpoint: str = "c" * 64, auc: float = 0.85) -> Any:
        registry = self.registry
        run_id = registry.start_run(self.ws.experiment, "churn-lifecycle", {"hybridtrain.job": "churn"})
        net, feat, columns = fitted(seed)
        ref = registry.log_model(run_id, net, feat.to_dict(), feat.n_features, columns=columns)
        trained = TrainOutput(site=SITE, model_uri=ref.model_uri, model_id=ref.model_id, run_key=run_key,
                              history=[{"epoch": 0, "global_step": 10, "train_loss": 0.5, "val_auc": auc}],
                              global_step=10, epochs_completed=1, resumed_from_step=None, checkpoints_written=1,
                              last_checkpoint=None, device="cpu", seconds=1.0, samples_per_second=100.0,
                              checkpoint_sha256=checkpoint)
        data = {t: DatasetVersion(path=f"data/{t}/churn", md5=f"{i}" * 32, size=100, tier=t, site=SITE)
                for i, t in enumerate(("raw", "curated", "approved"), start=1)}
        lineage = Lineage(job="churn", spec_hash=self.spec.spec_hash(), code_version="test", raw=data["raw"],
                          curated=data["curated"], approved=data["approved"], train_site=SITE, bytes_synced=0,
                          duration_s=1.0)
        champion = registry.by_alias(MODEL, CHAMPION)
        champion_auc = {"auc": float(champion.tags["hybridtrain.metric.auc"])} if champion else None
        evaluated = EvaluateResult(metrics={"auc": auc, "accuracy": 0.8, "log_loss": 0.4},
                                   champion_version=champion.version if champion else None,
                                   champion_metrics=champion_auc, better=True, delta=None, reason="better",
                                   threshold_failures=[], site=SITE, seconds=0.1)
        return stages.promote(self.ws, self.spec, run_id, trained, "fixed", lineage, evaluated, [], PEM,
                              "flow-run/test")

    def alias(self, name: str) -> str | None:
        info = self.registry.by_alias(MODEL, name)
        return info.version if info else None

    def versions(self) -> list[str]:
        return [v.version for v in self.registry.versions(MODEL)]

    def records(self, version: str) -> list[tuple[str, str]]:
        return [(r.action, r.outcome) for r in AuditLog.in_workspace(self.root).records()
                if r.subject == f"model {MODEL} v{version}"]

    def served(self) -> dict[str, tuple[str | None, list[str]]]:
        out = {}
        for name in ("onprem-serving", "cloud-serving"):
            held = self._target(name)
            out[name] = (held.current, held.versions)
        return out

    def _target(self, name: str) -> Any:
        from hybridtrain.governance.release import open_targets

        spec = next(t for t in self.spec.promotion.release_targets if t.name == name)
        return open_targets([spec], root=self.root, sites=self.ws.load_sites(),
                            trusted_key=SigningKey.from_pem(PEM).public)[0].holding(MODEL)


@pytest.fixture
def lifecycle(tmp_path) -> Lifecycle:
    world = Lifecycle(make_workspace(tmp_path / "ws"))
    first = world.promote("first-run", auc=0.80)
    assert (first.version, first.promoted, world.alias(CHAMPION)) == ("1", True, "1")
    return world


def interrupting(monkeypatch, cls: type, name: str) -> None:
    """The next call of ``cls.name`` does its work, then Ctrl-C arrives."""
    real: Callable[..., Any] = getattr(cls, name)

    def then_stop(self, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, real)
        raise Interrupted

    monkeypatch.setattr(cls, name, then_stop)


@pytest.mark.parametrize("after", ["register", "archive", "move_champion"])
def test_rerunning_the_lifecycle_finishes_its_interrupted_promotion_without_a_second_version(lifecycle, monkeypatch,
                                                                                            after):
    cls, name = {"register": (Registry, "register"), "archive": (BundleArchive, "put"),
                 "move_champion": (Registry, "move_champion")}[after]
    interrupting(monkeypatch, cls, name)
    with pytest.raises(Interrupted):
        lifecycle.promote("nightly", auc=0.85)
    assert lifecycle.versions() == ["1", "2"]
    assert PROMOTE_PENDING_TAG in lifecycle.registry.version(MODEL, "2").tags  # the orphan says whose it is

    again = lifecycle.promote("nightly", auc=0.85)  # `hybridtrain run jobs/churn.yaml --run-key nightly`
    assert (again.version, again.promoted, again.resumed, again.previous_version) == ("2", True, True, "1")
    assert lifecycle.versions() == ["1", "2"]
    assert (lifecycle.alias(CHAMPION), lifecycle.alias(PREVIOUS)) == ("2", "1")
    assert lifecycle.served() == {"onprem-serving": ("2", ["1", "2"]), "cloud-serving": ("2", ["1", "2"])}
    tags = lifecycle.registry.version(MODEL, "2").tags
    assert tags[PROMOTION_TAG] == "champion" and PROMOTE_PENDING_TAG not in tags
    assert tags["hybridtrain.governance.bundle.manifest_sha256"] == again.bundle_sha256
    assert lifecycle.records("2") == [("gate", "passed"), ("promotion", "champion -> v2 (previous v1)"),
                                      ("release", "current on 2 target(s)")]
    assert AuditLog.in_workspace(lifecycle.root).verify().ok
    # the version's cost is both runs' (the ledger line sums the runs that made it), once the first had recorded its own
    rerun = lifecycle.registry.recent_runs(lifecycle.ws.experiment, 1)[0]
    assert rerun.data.tags["hybridtrain.cost.runs"] == ("1" if after == "register" else "2")


def test_a_rerun_that_trained_another_model_leaves_the_interrupted_version_abandoned(lifecycle, monkeypatch):
    interrupting(monkeypatch, BundleArchive, "put")
    with pytest.raises(Interrupted):
        lifecycle.promote("nightly", auc=0.85)
    again = lifecycle.promote("nightly", seed=1, checkpoint="d" * 64, auc=0.86)  # its checkpoints were gone
    orphan = lifecycle.registry.version(MODEL, "2").tags
    assert orphan.get(STATUS_TAG) == "abandoned" and PROMOTE_PENDING_TAG not in orphan
    assert (again.version, again.promoted, again.resumed) == ("3", True, False)
    assert "the re-run of run key nightly trained a different model" in orphan["hybridtrain.status.reason"]
    assert [o.split(":")[0] for a, o in lifecycle.records("2") if a == "promotion"] == ["abandoned"]
    assert lifecycle.served()["onprem-serving"] == ("3", ["1", "3"])


def test_status_shows_an_unfinished_promotion_and_how_to_finish_it(lifecycle, monkeypatch):
    interrupting(monkeypatch, Registry, "register")
    with pytest.raises(Interrupted):
        lifecycle.promote("nightly", auc=0.85)
    monkeypatch.setattr(os, "environ", os.environ.copy())  # the command sets defaults in its process environment
    result = CliRunner().invoke(app, ["status", "--home", str(lifecycle.root)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"{MODEL}: v2 has an unfinished promotion (job churn, run key nightly, started " in said, said
    assert "`hybridtrain run SPEC --run-key nightly` finishes it" in said
    assert f"`hybridtrain retire {MODEL} 2` drops it" in said
