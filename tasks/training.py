"""Training tasks: train at the placed site and evaluate against the champion, one core call each."""

from __future__ import annotations

from prefect import get_run_logger, task

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.specs.job import JobSpec
from hybridtrain.training.preemption import preemption_trap
from hybridtrain.workspace import Workspace
from orchestration.gpu_lease import hold_gpus
from tasks.retry import BACKOFF_S, only_transient


@task(name="train")
def train(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str, run_id: str,
          run_key: str, capacity_class: str | None = None) -> stages.TrainOutput:
    """Train (resuming the newest valid checkpoint of ``run_key``). No task retries: the lifecycle's
    recovery (``hybridtrain.training.recovery``) decides after a preemption, a lost site or a failure.

    In this process, SIGTERM/SIGUSR1 (a pool shutting the worker down, a spot notice) is a
    preemption notice: the step in progress ends, a checkpoint is written and ``Preempted`` is
    raised. On an SSH host the job traps them itself; its log lines go to the run log. A GPU job first
    takes its GPUs at the site (``orchestration.gpu_lease``: on SSH hosts, or a share of a site without
    hosts; it waits while they are busy).
    """
    with preemption_trap(spec.checkpoint.preemption_grace_s) as notice, \
            hold_gpus(ws.load_sites().get(site), spec) as gpus:
        rate = stages.observed_preemption_rate(ws, site) if spec.checkpoint.auto_interval else None
        return stages.train(ws, spec, approved, site, run_id, run_key, on_line=get_run_logger().info,
                            should_stop=notice, preemptions_per_hour=rate, capacity_class=capacity_class, gpus=gpus)


@task(name="evaluate", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def evaluate(ws: Workspace, spec: JobSpec, approved: DatasetVersion, site: str,
             model_uri: str) -> stages.EvaluateResult:
    return stages.evaluate(ws, spec, approved, site, model_uri)


@task(name="move-checkpoint", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def move_checkpoint(ws: Workspace, spec: JobSpec, run_key: str, source: str, destination: str):
    """Bring the run's newest valid checkpoint from ``source``'s store to ``destination``'s."""
    return stages.move_checkpoint(ws, spec, run_key, source, destination)
