"""GPU leases on a site's SSH hosts, on a real Prefect server: jobs get different GPUs, wait for busy ones, and
free a dead holder's — never a live one's."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.placement.node_fit import host_key
from hybridtrain.specs.job import load_spec, parse_spec
from hybridtrain.specs.sites import SshHost
from tests.fixtures.placement_cases import site
from tests.fixtures.prefect_api import ended_flow_run_id
from tests.fixtures.workspaces import ROOT

pytestmark = pytest.mark.slow  # a Prefect server

HOST_A, HOST_B = SshHost(hostname="gpu-a", username="train", gpus=2), SshHost(hostname="gpu-b", username="train", gpus=2)
A, B = host_key(HOST_A), host_key(HOST_B)


def dc(name: str, *hosts: SshHost):
    return site(name, kind="onprem", gpus=sum(h.gpus for h in hosts)).model_copy(update={"hosts": hosts})


def job(gpus: int, nodes: int = 1):
    data = load_spec(ROOT / "jobs" / "churn.yaml").to_dict()
    data["resources"].update(gpus=gpus, nodes=nodes)
    return parse_spec(data)


@pytest.fixture
def lease(monkeypatch):
    """The GPU lease module, looking again every 0.2 s while it waits (dead holders' records are an hour old)."""
    from orchestration import gpu_lease

    monkeypatch.setattr(gpu_lease, "GPU_POLL_S", 0.2)
    return gpu_lease


def test_jobs_at_one_site_get_gpus_no_other_job_holds_and_give_them_back(prefect_server, lease):
    from prefect import flow

    sdc = dc("lease-dc-share", HOST_A, HOST_B)

    @flow
    def jobs() -> dict:
        out = {}
        with ExitStack() as first:
            out["first"] = lease.acquire_gpus(first, sdc, job(2))
            with ExitStack() as others:
                out["second"] = lease.acquire_gpus(others, sdc, job(1))
                out["third"] = lease.acquire_gpus(others, sdc, job(1))
                try:
                    lease.acquire_gpus(ExitStack(), sdc, job(1), wait_s=1.0)
                except NoFeasiblePlacement as exc:
                    out["full"] = str(exc)
            out["freed"] = lease.free_gpus(sdc)
            try:
                lease.acquire_gpus(ExitStack(), sdc, job(4))
            except NoFeasiblePlacement as exc:
                out["never"] = str(exc)
        out["end"] = lease.free_gpus(sdc)
        return out

    out = jobs()
    assert out["first"] == {A: (0, 1)} and out["second"] == {B: (0,)} and out["third"] == {B: (1,)}
    assert "site lease-dc-share has 0 of 4 GPUs free; the job needs 1" in out["full"]
    assert "waited 1 s" in out["full"]
    held = out["full"].split("held: ", 1)[1]  # the three holders, named with their GPUs and flow runs
    assert held.count("job churn (flow run ") == 3 and f"GPUs {A}: 0,1 (2 of its 4)" in held
    assert f"GPUs {B}: 0 (1 of its 4)" in held and f"GPUs {B}: 1 (1 of its 4)" in held
    assert out["freed"] == {A: [], B: [0, 1]}  # the two 1-GPU jobs gave theirs back when they ended
    assert "has 0 SSH host(s) with >= 4 GPUs" in out["never"]  # at once: no wait frees a 4-GPU host
    assert out["end"] == {A: [0, 1], B: [0, 1]}


def test_a_two_node_job_takes_gpus_on_two_hosts_and_a_waiting_job_starts_when_they_free(prefect_server, lease):
    from prefect import flow

    sdc = dc("lease-dc-wait", HOST_A, HOST_B)
    holding, done = threading.Event(), threading.Event()
    got: dict = {}

    @flow
    def two_nodes() -> None:
        with ExitStack() as held:
            got["two"] = lease.acquire_gpus(held, sdc, job(2, nodes=2))
            holding.set()
            done.wait(60)

    @flow
    def waiting() -> dict:
        with ExitStack() as held:
            return lease.acquire_gpus(held, sdc, job(1), wait_s=60)

    first = threading.Thread(target=two_nodes)
    first.start()
    try:
        assert holding.wait(60)
        assert got["two"] == {A: (0, 1), B: (0, 1)}
        second = threading.Thread(target=lambda: got.setdefault("waited", waiting()))
        second.start()
        second.join(3)
        assert second.is_alive() and "waited" not in got  # every GPU is held: it waits
    finally:
        done.set()
        first.join(60)
    second.join(60)
    # One of the GPUs the first job gave back: they come free one slot at a time, and a waiter that looks (every 0.2 s)
    # between two of them takes one freed so far, not always GPU 0 of host A (it once got A's GPU 1 under load).
    (host, gpus), = got["waited"].items()
    assert host in (A, B) and len(gpus) == 1 and gpus[0] in (0, 1), got["waited"]


def hold_without_a_run(names: list[str]):
    """GPUs taken outside any flow run, as by a process since killed, whose lease is never renewed nor released."""
    from prefect.concurrency._sync import acquire_concurrency_slots_with_lease

    return acquire_concurrency_slots_with_lease(names, 1, lease_duration=60, strict=True)


def record_holder(lease_id, flow_run: str, since: datetime) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import VariableCreate

    from orchestration.gpu_lease import HOLDER_PREFIX

    name = f"{HOLDER_PREFIX}{lease_id}"
    with get_client(sync_client=True) as client:
        client.create_variable(VariableCreate(name=name, value={
            "lease_id": str(lease_id), "site": "x", "gpus": {}, "flow_run": flow_run, "root_flow_run": "",
            "since": since.isoformat()}))
    return name


def test_a_dead_holders_gpus_are_freed_for_a_waiting_job_and_a_live_holders_never(prefect_server, lease):
    from prefect import flow, runtime
    from prefect.client.orchestration import get_client

    sdc = dc("lease-dc-dead", HOST_A)
    names = [lease.gpu_limit_name(sdc.name, A, i) for i in range(2)]
    lease.free_gpus(sdc)  # the limits exist
    dead = hold_without_a_run(names)
    dead_record = record_holder(dead.lease_id, ended_flow_run_id(), datetime.now(UTC) - timedelta(hours=1))

    @flow
    def after_a_crash() -> dict:
        with ExitStack() as held:
            return lease.acquire_gpus(held, sdc, job(2), wait_s=60)

    assert after_a_crash() == {A: (0, 1)}
    with get_client(sync_client=True) as client:
        assert client.read_variable_by_name(dead_record) is None  # its record went with it

    @flow
    def beside_a_live_holder() -> str:
        live = hold_without_a_run(names)  # held for this very run, which is still running
        record_holder(live.lease_id, str(runtime.flow_run.id), datetime.now(UTC) - timedelta(hours=1))
        try:
            with ExitStack() as held:
                lease.acquire_gpus(held, sdc, job(1), wait_s=1.0)
        except NoFeasiblePlacement as exc:
            return str(exc)
        finally:
            with get_client(sync_client=True) as client:
                assert client.read_global_concurrency_limit_by_name(names[0]).active_slots == 1
                client.release_concurrency_slots_with_lease(live.lease_id)
        return "took a live holder's GPUs"

    assert "0 free host(s) with >= 1 GPUs" in beside_a_live_holder()


def test_a_site_without_hosts_lends_its_gpu_count_in_gpus_and_a_waiting_job_starts_when_enough_free(prefect_server,
                                                                                                    lease):
    """Such a site's runs train in the worker's process: the pool's run limit counts runs, the lease counts GPUs."""
    from prefect import flow

    pool = site("lease-pool-4", kind="onprem", gpus=4)  # no SSH hosts
    cpu = job(1).model_copy(update={"resources": job(1).resources.model_copy(update={"gpus": 0, "gpu_type": None})})
    assert not pool.hosts and lease.needs_gpus(pool, job(1)) and not lease.needs_gpus(pool, cpu)
    holding, done = threading.Event(), threading.Event()
    got: dict = {}

    @flow
    def two_jobs() -> None:
        with ExitStack() as held:
            got["a"] = lease.acquire_gpus(held, pool, job(2))
            got["b"] = lease.acquire_gpus(held, pool, job(1))
            holding.set()
            done.wait(60)

    @flow
    def another(gpus: int, nodes: int, wait_s: float) -> str:
        try:
            with ExitStack() as held:
                lease.acquire_gpus(held, pool, job(gpus, nodes), wait_s=wait_s)
                return f"held with {lease.site_gpus_free(pool)[0]} free"
        except NoFeasiblePlacement as exc:
            return str(exc)

    first = threading.Thread(target=two_jobs)
    first.start()
    try:
        assert holding.wait(60)
        assert got == {"a": None, "b": None} and lease.site_gpus_free(pool) == (1, 4)
        assert "site lease-pool-4 has 1 of 4 GPUs free; the job needs 2 (waited 1 s)" in another(2, 1, 1.0)
        assert another(1, 1, 1.0) == "held with 0 free"  # one GPU was free: it fits beside them
        second = threading.Thread(target=lambda: got.setdefault("waited", another(2, 1, 60.0)))
        second.start()
        second.join(3)
        assert second.is_alive() and "waited" not in got  # 1 free, 2 needed: it waits
    finally:
        done.set()
        first.join(60)
    second.join(60)
    assert got["waited"] == "held with 2 free"  # it started once the first two gave theirs back
    assert lease.site_gpus_free(pool) == (4, 4)
    never = another(2, 3, 3600.0)  # 3 nodes × 2 GPUs: more than the site has, so at once, not after the wait
    assert "site lease-pool-4 has 4 GPUs (gpu_count); the job needs 6" in never and "waited" not in never
    assert lease.site_gpus_free(pool.model_copy(update={"gpu_count": 6})) == (6, 6)  # sites.yaml grew the site


def test_a_site_never_lends_more_gpus_than_its_gpu_count_even_where_its_hosts_declare_more(prefect_server, lease):
    """gpu_count is what the site gives this platform at once: the hosts' 4 GPUs, but 2 of them at a time; with a
    larger gpu_count the hosts' free GPUs are what a job waits for."""
    from prefect import flow

    capped = dc("lease-dc-cap", HOST_A, HOST_B).model_copy(update={"gpu_count": 2})
    roomy = dc("lease-dc-roomy", HOST_A, HOST_B).model_copy(update={"gpu_count": 8})

    @flow
    def fill(sdc, sizes: list[int]) -> dict:
        out = {}
        with ExitStack() as held:
            out["held"] = [lease.acquire_gpus(held, sdc, job(n)) for n in sizes]
            out["share"] = lease.site_gpus_free(sdc)
            try:
                lease.acquire_gpus(ExitStack(), sdc, job(1), wait_s=1.0)
            except NoFeasiblePlacement as exc:
                out["full"] = str(exc)
        out["after"] = lease.site_gpus_free(sdc), lease.free_gpus(sdc)
        return out

    out = fill(capped, [1, 1])
    assert out["held"] == [{A: (0,)}, {A: (1,)}] and out["share"] == (0, 2)
    assert "site lease-dc-cap has 0 of 2 GPUs free; the job needs 1 (waited 1 s)" in out["full"]  # B's GPUs idle
    assert out["after"] == ((2, 2), {A: [0, 1], B: [0, 1]})
    out = fill(roomy, [2, 2])
    assert out["share"] == (4, 8)
    assert "0 free host(s) with >= 1 GPUs (2 hosts, 2 busy, 0 with fewer GPUs)" in out["full"]
    assert out["after"] == ((8, 8), {A: [0, 1], B: [0, 1]})
    with pytest.raises(NoFeasiblePlacement, match="has 2 GPUs \\(gpu_count\\); the job needs 4"):
        flow(lambda: lease.acquire_gpus(ExitStack(), capped, job(2, nodes=2)))()  # at once: the hosts could


def record(lease_id, flow_run: str, since: datetime, **fields) -> str:
    """A GPU holder record, as ``orchestration.gpu_lease`` writes it (``fields``: its site, gpus, limits, slots)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import VariableCreate

    from orchestration.gpu_lease import HOLDER_PREFIX

    name = f"{HOLDER_PREFIX}{lease_id}"
    with get_client(sync_client=True) as client:
        client.create_variable(VariableCreate(name=name, value={
            "lease_id": str(lease_id), "job": "churn", "flow_run": flow_run, "root_flow_run": "",
            "since": since.isoformat(), **fields}))
    return name


def test_gpus_whose_lease_went_with_a_killed_server_are_given_back_once_and_a_live_holders_never(prefect_server,
                                                                                                  lease, caplog):
    """A ``kill -9``'d run's embedded server takes its leases along, the slot counts stay: a waiting job gives the
    slots back by name — no more than the live holders leave unaccounted for."""
    from prefect import flow, runtime
    from prefect.client.orchestration import get_client

    pool = site("lease-pool-lost", kind="onprem", gpus=2)  # no SSH hosts: the whole lease is the share of gpu_count
    limit = lease.site_limit_name(pool.name)
    assert lease.site_gpus_free(pool) == (2, 2)  # the limit exists
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    gone = ended_flow_run_id()
    with get_client(sync_client=True) as client:  # the killed run's GPU: a slot held by no lease
        client.increment_concurrency_slots(names=[limit], slots=1, mode="concurrency")
    # its record, as runs before records named their limits wrote it; and one left behind by a holder whose slot
    # was given back already (it died between giving it back and deleting its record)
    lost = record(uuid4(), gone, hour_ago, site=pool.name, gpus="1 of its 2 GPUs")
    stale = record(uuid4(), gone, hour_ago, site=pool.name, gpus="1 of its 2 GPUs", limits=[limit], slots=1)

    def active() -> int:
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(limit).active_slots

    @flow
    def beside_a_live_holder() -> int:
        live = hold_without_a_run([limit])  # held for this very run, which is still running
        record(live.lease_id, str(runtime.flow_run.id), hour_ago, site=pool.name, gpus="1 of its 2 GPUs",
               limits=[limit], slots=1)
        try:
            with ExitStack() as held:
                lease.acquire_gpus(held, pool, job(1), wait_s=60)
                return active()
        finally:
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(live.lease_id)

    assert beside_a_live_holder() == 2  # the live holder's GPU and this job's: the lost one came back, once
    assert active() == 0
    assert "has ended without giving them back" in caplog.text and gone in caplog.text
    with get_client(sync_client=True) as client:
        assert client.read_variable_by_name(lost) is None and client.read_variable_by_name(stale) is None
