"""GpuLease: the GPUs of a site that a training holds, as Prefect global concurrency slots.

Every GPU of every SSH host of a site is a global concurrency limit of one slot,
``gpu-<site>-<user>-<host>-<port>-<index>``. A training of a job with ``resources.gpus`` >= 1 at
such a site (a lifecycle's train stage, a sweep trial or a federated round) takes, in one request, the GPUs
``placement.node_fit.pick_gpus`` chooses among the free ones — ``resources.nodes`` hosts with
that many free GPUs each, the lowest indices on each — renews the lease while it trains and frees
the GPUs when it ends. The job sees only its GPUs (``CUDA_VISIBLE_DEVICES`` on each host). So two
jobs at one site never share a GPU, and a multi-node job never lands on GPUs another job holds.

Every site is also one limit, ``gpus-<site>``, of ``gpu_count`` slots (what the site gives this
platform at once), and a GPU job's training takes ``nodes × gpus`` of them with its GPUs, all or
none. So the jobs training at a site at once never need more GPUs than it gives, whatever their
sizes — the pool's run limit counts runs, not GPUs — even where its hosts declare more. At a site
without SSH hosts (its runs train in the pool worker's process, or on cloud instances started for
them) that share is the whole lease; which of the worker machine's GPUs a job trains on is then
claimed by ``hybridtrain.training.local_gpus`` (one lock per GPU, shared by every worker on the
machine).

When too few are free, the training waits, logging what it waits for, up to ``$HYBRIDTRAIN_GPU_WAIT_S`` (6 h); then
it fails naming the site and the counts. A job no amount of waiting can fit (too few hosts with
that many GPUs, more GPUs than ``gpu_count``) fails at once. A CPU job (``resources.gpus: 0``)
and a site whose hosts declare no GPUs (``hosts[].gpus``, default 0: as before, on the first hosts,
seeing every GPU) take no lease.

A holder that dies keeps its GPUs until its lease expires (``LEASE_S`` after its last renewal),
when the served stack's repossessor frees them. A server without that service (the embedded
default) never would, so each lease's holder is written to the Prefect variable
``gpu-lease-<lease id>`` (with the limits and slots it holds), deleted after the lease is given
back, and a waiting training frees the GPUs of a holder whose run has ended, as for the job's
training lease (``orchestration.training_lease``): it deletes the record (of several waiting
trainings only the one whose delete succeeds goes on), then revokes the lease if the server still
has it. If the server has lost it (the embedded default keeps leases in its process's memory, and
a ``kill -9`` of ``hybridtrain run`` takes its server along, while the slot counts stay in the
database), it gives the slots back by name — no more of a limit's slots than the recorded live
holders leave unaccounted for, so a live holder's GPUs are never given away.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from uuid import UUID

from prefect import get_run_logger, runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate, VariableCreate
from prefect.concurrency._leases import maintain_concurrency_lease
from prefect.concurrency._sync import acquire_concurrency_slots_with_lease
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.placement.node_fit import host_key, host_shortfall, pick_gpus
from hybridtrain.specs.job import JobSpec
from hybridtrain.specs.sites import Site
from hybridtrain.training.local_gpus import gpu_wait_s
from orchestration.training_lease import (
    LEASE_S,
    give_back,
    give_back_slots,
    holder_ended_long_ago,
    lease_known,
    release_lease,
)

#: How long a training waits for enough free GPUs before it gives up.
#: Seconds between looks at the free GPUs while waiting (and the longest one request for them waits).
GPU_POLL_S = float(os.environ.get("HYBRIDTRAIN_GPU_POLL_S", "5"))
HOLDER_PREFIX = "gpu-lease-"
PAGE = 200

#: The GPUs a training holds: ``host_key`` → the GPU indices it may use there.
Gpus = Mapping[str, tuple[int, ...]]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_limit_name(site: str, key: str, index: int) -> str:
    """The one-slot global concurrency limit of GPU ``index`` of host ``key`` (``host_key``) at ``site``."""
    return f"gpu-{_slug(site)}-{_slug(key)}-{index}"


def needs_gpus(site: Site, spec: JobSpec) -> bool:
    """Whether training ``spec`` at ``site`` takes a GPU lease: a GPU job on SSH hosts that declare their GPUs, or
    at a site without SSH hosts (its share of ``gpu_count``; a site with ``instances:`` lists no hosts)."""
    if spec.resources.gpus < 1:
        return False
    return any(h.gpus > 0 for h in site.hosts) if site.hosts else site.gpu_count > 0


def free_gpus(site: Site) -> dict[str, list[int]]:
    """Each SSH host's free GPU indices, from the limits' active slots; creates the limits it lacks."""
    names = {gpu_limit_name(site.name, host_key(h), i): (host_key(h), i) for h in site.hosts for i in range(h.gpus)}
    taken: dict[str, int] = {}
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            page = client.read_global_concurrency_limits(limit=PAGE, offset=offset)
            taken.update({g.name: g.active_slots for g in page if g.name in names})
            if len(page) < PAGE:
                break
            offset += PAGE
        for name in names.keys() - taken.keys():
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
            taken[name] = 0
    free: dict[str, list[int]] = {host_key(h): [] for h in site.hosts}
    for name, (key, index) in names.items():
        if taken[name] == 0:
            free[key].append(index)
    return free


def _holders() -> list[tuple[str, dict]]:
    """The recorded GPU lease holders: (variable name, record)."""
    with get_client(sync_client=True) as client:
        response = client.request("POST", "/variables/filter", json={
            "variables": {"name": {"like_": f"{HOLDER_PREFIX}%"}}, "limit": PAGE})
    return [(v["name"], v["value"]) for v in response.json() if isinstance(v.get("value"), dict)]


def holding_at(site: str) -> str:
    """Who holds GPUs at ``site`` now, from the holders' records: ``GPUs …: job J (flow run R, since T UTC); …``."""
    held = sorted((r for _, r in _holders() if r.get("site") == site), key=lambda r: str(r.get("since", "")))
    takes: dict[tuple, dict] = {}  # one record per lease, and a take has one or two leases
    for r in held:
        takes.setdefault((r.get("flow_run"), r.get("job"), r.get("gpus")), r)
    return "; ".join(f"{r.get('gpus')}: job {r.get('job')} (flow run {r.get('flow_run') or '?'}, since "
                     f"{str(r.get('since', ''))[:19].replace('T', ' ')} UTC)" for r in takes.values()) \
        or "no holder recorded"


def held_limits(record: dict) -> tuple[list[str], int] | None:
    """The limits a holder's lease holds and how many slots of each, from its record; None when the record does
    not say (one written before records named them, for GPUs on SSH hosts: its take had two leases)."""
    if isinstance(record.get("limits"), list) and isinstance(record.get("slots"), int):
        return [str(n) for n in record["limits"]], record["slots"]
    share = re.fullmatch(r"(\d+) of its \d+ GPUs", str(record.get("gpus", "")))
    if share and record.get("site"):  # a site without hosts: its one lease is the share of gpu_count
        return [site_limit_name(str(record["site"]))], int(share.group(1))
    return None


def _claim(name: str) -> bool:
    """Delete a dead holder's record; False when another waiting training deleted it first (and frees it)."""
    with get_client(sync_client=True) as client:
        try:
            client.delete_variable_by_name(name)
        except ObjectNotFound:
            return False
    return True


def _active_slots(names: set[str]) -> dict[str, int]:
    with get_client(sync_client=True) as client:
        out = {}
        for name in names:
            try:
                out[name] = client.read_global_concurrency_limit_by_name(name).active_slots
            except ObjectNotFound:
                out[name] = 0
        return out


def reap_dead_gpu_holders(tried: set[str]) -> list[str]:
    """Free the GPUs of every recorded holder whose run has ended and whose lease should have expired.

    Each dead holder's record is deleted first (the claim: of several waiting trainings, the one whose
    delete succeeds frees it). A lease the server still has is revoked by its id, which never frees
    GPUs somebody else holds. A lease the server no longer has (lost with the server that granted it)
    is given back by name, but of each limit only the slots the remaining recorded holders do not
    account for: a slot given back already (the repossessor, or the holder itself just before it
    died) is not given back twice. Returns one line per holder freed.
    """
    freed: list[str] = []
    lost: list[dict] = []
    records = _holders()
    for name, record in records:
        lease = record.get("lease_id")
        if not lease or lease in tried or not holder_ended_long_ago(record):
            continue
        tried.add(lease)
        if not _claim(name):
            continue
        what = (f"freed {record.get('gpus')} at site {record.get('site')}: their holder, flow run "
                f"{record.get('flow_run')}, has ended")
        if lease_known(UUID(lease)):
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(UUID(lease))
            freed.append(what)
        else:
            lost.append(record)
    if lost:
        freed += _give_back_lost(lost)
    return freed


def _give_back_lost(lost: list[dict]) -> list[str]:
    """Give back, by name, the slots of dead holders whose leases the server no longer has (see above)."""
    remaining = _holders()  # the records left: holders alive, or dead and not yet freed
    limits = {n for r in lost if held_limits(r) for n in held_limits(r)[0]}
    unaccounted = _active_slots(limits)
    unknown_sites = set()
    for _, record in remaining:
        held = held_limits(record)
        if held is None:
            unknown_sites.add(record.get("site"))
            continue
        for n in set(held[0]) & limits:
            unaccounted[n] -= held[1]
    freed = []
    for record in lost:
        held = held_limits(record)
        if held is None or record.get("site") in unknown_sites:
            continue  # which limits it (or a holder beside it) holds is not recorded: nothing is given back
        names, slots = held
        given = {}
        for n in names:
            take = min(slots, unaccounted[n])
            if take > 0:
                give_back_slots([n], take, record["since"])
                unaccounted[n] -= take
                given[n] = take
        if given:
            freed.append(f"freed {record.get('gpus')} at site {record.get('site')}: their holder, flow run "
                         f"{record.get('flow_run')}, has ended without giving them back, and the Prefect server "
                         "that granted them no longer has the lease (its server was stopped with it)")
    return freed


def _record(lease_id: UUID, site: str, job: str, what: str, limits: list[str], slots: int) -> str:
    name = f"{HOLDER_PREFIX}{lease_id}"
    root = runtime.flow_run.root_flow_run_id if hasattr(runtime.flow_run, "root_flow_run_id") else None
    record = {"lease_id": str(lease_id), "site": site, "job": job,
              "gpus": what, "flow_run": str(runtime.flow_run.id or ""),
              "root_flow_run": str(root or ""), "since": datetime.now(UTC).isoformat(),
              "limits": limits, "slots": slots}
    with get_client(sync_client=True) as client:
        client.create_variable(VariableCreate(name=name, value=record))
    return name


def _forget(name: str) -> None:
    with get_client(sync_client=True) as client:
        client.delete_variable_by_name(name)


class _Held:
    """One lease a training holds and its holder record: given back in that order (the record is deleted
    only once the lease is released, so a record is left behind only when its lease may still hold slots)."""

    def __init__(self, lease_id: UUID) -> None:
        self.lease_id = lease_id
        self.record: str | None = None

    def give_back(self) -> None:
        release_lease(self.lease_id)
        if self.record is not None:
            _forget(self.record)


def site_limit_name(site: str) -> str:
    """The global concurrency limit of a site's ``gpu_count`` GPUs (one slot each)."""
    return f"gpus-{_slug(site)}"


def site_gpus_free(site: Site) -> tuple[int, int]:
    """(free, total) of the site's ``gpu_count`` GPUs; creates its limit, or resizes it to ``gpu_count``."""
    name = site_limit_name(site.name)
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=site.gpu_count))
            except ObjectAlreadyExists:
                pass
            return site.gpu_count, site.gpu_count
        if limit.limit != site.gpu_count:  # sites.yaml changed its count
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=site.gpu_count))
        return max(0, site.gpu_count - limit.active_slots), site.gpu_count


@dataclass(frozen=True)
class _Take:
    """What one training takes: per request, these limits and ``slots`` of each (all or none);
    ``gpus`` for the caller, ``what`` for logs."""

    requests: list[tuple[list[str], int]]
    gpus: Gpus | None
    what: str


def _site_share(site: Site, need: int) -> tuple[list[str], int]:
    """``need`` of the site's ``gpu_count`` slots, or NoFeasiblePlacement naming the counts when fewer are free."""
    free, total = site_gpus_free(site)
    if free < need:
        raise NoFeasiblePlacement("", {site.name: f"site {site.name} has {free} of {total} GPUs free; "
                                                  f"the job needs {need}"})
    return [site_limit_name(site.name)], need


def _choose(site: Site, spec: JobSpec) -> _Take:
    """What a training of ``spec`` takes at ``site`` now: its share of ``gpu_count`` and, on SSH hosts, the GPUs;
    NoFeasiblePlacement naming the counts when too few are free."""
    need = spec.resources.total_gpus
    share = _site_share(site, need)
    if not site.hosts:
        return _Take([share], None, f"{need} of its {site.gpu_count} GPUs")
    gpus = pick_gpus(site, spec.resources.nodes, spec.resources.gpus, free_gpus(site), job=spec.name)
    shown = "; ".join(f"{k}: {','.join(map(str, v))}" for k, v in gpus.items())
    return _Take([([gpu_limit_name(site.name, key, i) for key, indices in gpus.items() for i in indices], 1), share],
                 gpus, f"GPUs {shown} ({need} of its {site.gpu_count})")


def acquire_gpus(held: ExitStack, site: Site, spec: JobSpec, *, wait_s: float | None = None) -> Gpus | None:
    """Take the GPUs ``spec`` trains on at ``site`` (see the module docstring), released when ``held`` closes:
    ``nodes × gpus`` of its ``gpu_count`` and, on SSH hosts, the GPUs it returns (``host_key`` → indices);
    None at a site without hosts (the job sees what its process sees).

    Raises ``NoFeasiblePlacement`` naming the site and the counts when the site can never hold the
    job, or when not enough GPUs were free within ``wait_s`` (default ``$HYBRIDTRAIN_GPU_WAIT_S``, see
    ``hybridtrain.training.local_gpus.gpu_wait_s``).
    """
    nodes, per_node, need = spec.resources.nodes, spec.resources.gpus, spec.resources.total_gpus
    never = host_shortfall(site, nodes, per_node) if site.hosts else None
    if never is None and need > site.gpu_count:
        never = f"site {site.name} has {site.gpu_count} GPUs (gpu_count); the job needs {need}"
    if never is not None:
        raise NoFeasiblePlacement(spec.name, {site.name: never},
                                  hint="lower resources.gpus or resources.nodes, or place the job elsewhere")
    log = get_run_logger()
    wait = gpu_wait_s() if wait_s is None else wait_s
    deadline = time.monotonic() + wait
    tried: set[str] = set()
    said = None

    def give_up(why: str) -> NoFeasiblePlacement:
        return NoFeasiblePlacement(spec.name, {site.name: f"{why} (waited {wait:.0f} s); held: {holding_at(site.name)}"},
                                   hint="wait for the site's runs to end, or place the job elsewhere")

    while True:
        try:
            take = _choose(site, spec)
        except NoFeasiblePlacement as exc:
            why = exc.rejected.get(site.name, str(exc))
            for line in reap_dead_gpu_holders(tried):
                log.warning(line)
            if time.monotonic() >= deadline:
                raise give_up(why) from exc
            if why != said:
                log.info("waiting for GPUs: %s; held: %s", why, holding_at(site.name))
                said = why
            time.sleep(GPU_POLL_S)
            continue
        granted = []
        try:
            for names, slots in take.requests:
                granted.append(acquire_concurrency_slots_with_lease(names, slots, lease_duration=LEASE_S, strict=True,
                                                                    timeout_seconds=GPU_POLL_S).lease_id)
        except BaseException as exc:  # all or none: give back what was taken
            for lease_id in granted:  # one failing to be given back is logged: exc goes on
                give_back(f"release GPUs at site {site.name}", partial(release_lease, lease_id))(
                    type(exc), exc, exc.__traceback__)
            if not isinstance(exc, TimeoutError):
                raise
            if time.monotonic() >= deadline:  # another training took some first: look again, within the wait
                raise give_up(f"{take.what} looked free but could not be taken") from exc
            continue
        for lease_id, (names, slots) in zip(granted, take.requests, strict=True):
            lease = _Held(lease_id)
            held.push(give_back(f"give back {take.what} at site {site.name}", lease.give_back))
            held.enter_context(maintain_concurrency_lease(lease_id, LEASE_S, raise_on_lease_renewal_failure=True))
            lease.record = _record(lease_id, site.name, spec.name, take.what, names, slots)
        log.info("holding %s at site %s", take.what, site.name)
        return take.gpus


@contextmanager
def hold_gpus(site: Site, spec: JobSpec) -> Iterator[Gpus | None]:
    """The GPUs ``spec`` trains on at ``site``, held for the block: the SSH hosts' GPUs it may use, or None (it
    holds a share of a site without hosts, or takes no lease)."""
    if not needs_gpus(site, spec):
        yield None
        return
    with ExitStack() as held:
        yield acquire_gpus(held, site, spec)
