"""Federated tasks: the training-mode decision and each site step of federated training, one core call each."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import task

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.federated import site as steps
from hybridtrain.federated.planning import ModeDecision, decide_mode
from hybridtrain.federated.secure_aggregation import SecureRound
from hybridtrain.specs.job import JobSpec
from hybridtrain.workspace import Workspace
from orchestration.gpu_lease import hold_gpus
from tasks.data import pseudonym_key


@task(name="training-mode")
def training_mode(ws: Workspace, spec: JobSpec) -> ModeDecision:
    from hybridtrain.placement.policy import Policy

    sites = ws.load_sites()
    return decide_mode(spec, sites, Policy.load(ws.policy_file, sites), datetime.now(UTC),
                       control_site=stages.control_site(ws, sites).name)


@task(name="federated-prepare-site")
def prepare_site(ws: Workspace, spec: JobSpec, site: str, run_key: str, aggregation_site: str) -> steps.SitePrepared:
    return steps.prepare(ws, spec, site, pseudonym_key(ws.pseudonym_key_block), run_key, aggregation_site)


@task(name="federated-train-round")
def train_round(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                featurizer: dict, aggregation_site: str, secure: SecureRound | None = None) -> steps.SiteUpdate:
    """A GPU job's round trains on GPUs it holds at its site (``orchestration.gpu_lease``), as a centralized
    job's training does; a round that only masks its kept update again takes none."""
    return steps.train_round(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site, secure,
                             hold_gpus=lambda: hold_gpus(ws.load_sites().get(site), spec))


@task(name="federated-evaluate-site")
def evaluate_site(ws: Workspace, spec: JobSpec, site: str, run_key: str, rnd: int, approved: DatasetVersion,
                  featurizer: dict, aggregation_site: str) -> steps.SiteEvaluation:
    return steps.evaluate_global(ws, spec, site, run_key, rnd, approved, featurizer, aggregation_site)
