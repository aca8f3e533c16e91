"""Burst tasks: read an on-prem pool's queue, move a waiting run to another site, announce released capacity."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events import emit_event
from prefect.states import Cancelled
from pydantic import BaseModel

from hybridtrain import stages
from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.datasets.transfer import TransferRecord
from hybridtrain.workspace import Workspace
from orchestration.queues import PoolRun, PrefectQueues
from tasks.retry import BACKOFF_S, only_transient

#: Prefix of the Cancelled-state message of a moved run; the waiting lifecycle follows it.
MOVED = "moved:"


class Relocation(BaseModel):
    run_id: str
    from_site: str
    to_site: str
    new_run_id: str | None
    reason: str
    transfer: TransferRecord | None
    done: bool
    note: str = ""


@task(name="read-pool")
def read_pool(ws: Workspace, site: str) -> list[PoolRun]:
    sites = ws.load_sites()
    return PrefectQueues(sites).runs(sites.get(site).work_pool)


@task(name="read-queues")
def read_queues(ws: Workspace) -> dict:
    return PrefectQueues(ws.load_sites()).snapshot(datetime.now(UTC))


@task(name="relocate", retries=2, retry_delay_seconds=BACKOFF_S, retry_condition_fn=only_transient)
def relocate(ws: Workspace, run: PoolRun, from_site: str, to_site: str, reason: str) -> Relocation:
    """Sync the run's data to ``to_site``, submit the same work there, cancel the waiting original.

    The replacement is created first and the original cancelled only while it is still
    scheduled; if it started meanwhile, the replacement is deleted and nothing moves.
    """
    sites = ws.load_sites()
    target = sites.get(to_site)
    approved = DatasetVersion.model_validate(run.parameters["approved"])
    synced = stages.sync(ws, approved, to_site, run.spec)
    params = {**run.parameters, "approved": synced.dataset.model_dump(mode="json"), "site": to_site}
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(f"train-stage/{target.work_pool}")
        current = client.read_flow_run(run.run_id)
        if current.state is None or current.state.type is not StateType.SCHEDULED:
            return Relocation(run_id=run.run_id, from_site=from_site, to_site=to_site, new_run_id=None,
                              reason=reason, transfer=synced.transfer, done=False, note="it started meanwhile")
        new = client.create_flow_run_from_deployment(deployment.id, parameters=params, tags=["relocated"])
        result = client.set_flow_run_state(
            run.run_id, Cancelled(message=f"{MOVED}{new.id}:{to_site} by the burst controller: {reason}"))
        if result.state is None or result.state.type is not StateType.CANCELLED:
            client.delete_flow_run(new.id)
            return Relocation(run_id=run.run_id, from_site=from_site, to_site=to_site, new_run_id=None,
                              reason=reason, transfer=synced.transfer, done=False, note="the original could not be "
                              "cancelled (it was picked up)")
    moved = Relocation(run_id=run.run_id, from_site=from_site, to_site=to_site, new_run_id=str(new.id),
                       reason=reason, transfer=synced.transfer, done=True)
    mlflow_run = run.parameters.get("run_id")
    if mlflow_run:
        stages.save_result(ws, mlflow_run, "relocation", moved)
    emit_event(event="hybridtrain.burst.moved", resource={"prefect.resource.id": f"prefect.flow-run.{new.id}"},
               payload=moved.model_dump(mode="json"))
    return moved


@task(name="announce-release")
def announce_release(site: str, reason: str) -> None:
    """Tell automations that burst capacity can go (e.g. scale cloud workers down)."""
    emit_event(event="hybridtrain.burst.release", resource={"prefect.resource.id": f"hybridtrain.site.{site}"},
               payload={"reason": reason})
