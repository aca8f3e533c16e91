"""NodeFit: whether a site can hold a job's ``resources.nodes`` hosts together, and which hosts it reserves.

A multi-node job (``resources.nodes: N``, ``resources.gpus: G`` per node) runs as one torchrun
job over N hosts of ONE site — the ranks all-reduce every step, so they never span sites. Pure
functions of explicit inputs, like the rest of placement:

- ``node_shortfall(site, N, G)`` — the static check the policy applies to every candidate: an
  on-prem site needs N SSH hosts (``sites.yaml`` ``hosts:``) with at least G GPUs each; an
  on-prem site without SSH hosts runs jobs in a local process and has one node; a cloud site
  starts N instances when it declares ``instances:``, so it needs ``max_instances >= N``,
  ``gpus_per_instance >= G`` and ``gpu_count >= N × G`` (checked with the other GPU limits); a cloud
  site with neither ``hosts:`` nor ``instances:`` trains in its worker's process and has one node.
- ``reserve_hosts(site, N, G, busy)`` — at run time: the first N eligible hosts that are not
  ``busy`` (hosts running another job, as the caller knows them), in catalog order. The first
  one hosts the rendezvous. Too few free hosts raises ``NoFeasiblePlacement`` with the numbers.
- ``pick_gpus(site, N, G, free)`` — the same choice from each host's free GPU indices (the
  train stage leases them, ``orchestration.gpu_lease``), with the indices the job may use on
  each chosen host; ``host_shortfall`` says when no amount of waiting would free enough.

The N nodes are priced together: the placement request carries ``gpus = N × G``, so compute
cost, queue wait and GPU limits all see the whole job.

Example: ``onprem-dc1`` lists hosts ``gpu1`` (8 GPUs), ``gpu2`` (8) and ``gpu3`` (4). A job with
``nodes: 2, gpus: 8`` fits (gpu1, gpu2); with ``gpu2`` busy, ``reserve_hosts`` says "site
onprem-dc1 has 1 free host with >= 8 GPUs (3 hosts, 1 busy, 1 with fewer GPUs); the job needs 2".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hybridtrain.errors import NoFeasiblePlacement
from hybridtrain.specs.sites import Site, SiteKind, SshHost


def host_key(host: SshHost) -> str:
    """How a host is named in ``busy`` sets and messages: ``user@hostname:port``."""
    return f"{host.username}@{host.hostname}:{host.port}"


@dataclass(frozen=True)
class HostReservation:
    """The hosts one multi-node job trains on; ``hosts[0]`` runs the rendezvous."""

    site: str
    hosts: tuple[SshHost, ...]
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    @property
    def rendezvous(self) -> SshHost:
        return self.hosts[0]


def _eligible(site: Site, gpus_per_node: int) -> list[SshHost]:
    return [h for h in site.hosts if h.gpus >= gpus_per_node]


def node_shortfall(site: Site, nodes: int, gpus_per_node: int) -> str | None:
    """Why ``site`` cannot hold ``nodes`` nodes of ``gpus_per_node`` GPUs (None: it can, when they are free)."""
    if nodes <= 1:
        return None
    if site.hosts:
        eligible = _eligible(site, gpus_per_node)
        if len(eligible) >= nodes:
            return None
        fewer = len(site.hosts) - len(eligible)
        return (f"site {site.name} has {len(eligible)} SSH host(s) with >= {gpus_per_node} GPUs"
                f"{f' ({fewer} more with fewer GPUs)' if fewer else ''}; the job needs {nodes} nodes")
    if site.kind is SiteKind.cloud:
        fleet = site.instances
        if fleet is None:
            return (f"site {site.name} lists no SSH hosts and starts no instances (it trains in the worker's "
                    f"process: 1 node); the job needs {nodes} nodes — add an instances: block to "
                    f"sites.{site.name} or set resources.nodes: 1")
        if fleet.max_instances < nodes:
            return (f"site {site.name} starts at most {fleet.max_instances} instance(s) for one job "
                    f"(sites.{site.name}.instances.max_instances); the job needs {nodes} nodes")
        if fleet.gpus_per_instance < gpus_per_node:
            return (f"site {site.name}'s instances ({fleet.instance_type}) have {fleet.gpus_per_instance} GPU(s); "
                    f"the job needs {gpus_per_node} per node")
        return None
    return (f"site {site.name} lists no SSH hosts (it trains in a local process: 1 node); the job needs "
            f"{nodes} nodes — add hosts to sites.{site.name}.hosts or set resources.nodes: 1")


def reserve_hosts(site: Site, nodes: int, gpus_per_node: int, busy: Collection[str] = (),
                  job: str = "job") -> HostReservation:
    """The first ``nodes`` free hosts of ``site`` with ``gpus_per_node`` GPUs or more.

    ``busy`` holds ``host_key`` names of hosts already running something. Raises
    ``NoFeasiblePlacement`` naming the site and the counts when there are too few.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    static = node_shortfall(site, nodes, gpus_per_node)
    if static is not None:
        raise NoFeasiblePlacement(job, {site.name: static})
    if not site.hosts:
        raise NoFeasiblePlacement(job, {site.name: f"site {site.name} lists no SSH hosts to reserve"})
    eligible = _eligible(site, gpus_per_node)
    free = [h for h in eligible if host_key(h) not in busy]
    if len(free) < nodes:
        taken = len(eligible) - len(free)
        fewer = len(site.hosts) - len(eligible)
        why = (f"site {site.name} has {len(free)} free host(s) with >= {gpus_per_node} GPUs ({len(site.hosts)} "
               f"hosts, {taken} busy, {fewer} with fewer GPUs); the job needs {nodes}")
        raise NoFeasiblePlacement(job, {site.name: why}, hint="wait for hosts to free up or place it elsewhere")
    return HostReservation(site=site.name, hosts=tuple(free[:nodes]), gpus_per_node=gpus_per_node)


def host_shortfall(site: Site, nodes: int, gpus_per_node: int) -> str | None:
    """Why ``site``'s SSH hosts can never hold ``nodes`` × ``gpus_per_node`` GPUs, however many are free
    (None: they can; a site without SSH hosts is not judged here)."""
    eligible = _eligible(site, gpus_per_node)
    if not site.hosts or len(eligible) >= nodes:
        return None
    fewer = len(site.hosts) - len(eligible)
    return (f"site {site.name} has {len(eligible)} SSH host(s) with >= {gpus_per_node} GPUs"
            f"{f' ({fewer} more with fewer GPUs)' if fewer else ''}; the job needs {nodes}")


def pick_gpus(site: Site, nodes: int, gpus_per_node: int, free: Mapping[str, Sequence[int]],
              job: str = "job") -> dict[str, tuple[int, ...]]:
    """Which GPUs of which hosts a job of ``nodes`` × ``gpus_per_node`` GPUs trains on, given each
    host's free GPU indices (``free``, by ``host_key``; a host missing from it has all its GPUs free).

    The hosts are the ones ``reserve_hosts`` picks among those with enough free GPUs (catalog
    order), and on each the lowest free indices; the first host runs the rendezvous. Raises
    ``NoFeasiblePlacement`` with the counts when too few hosts have enough free GPUs.

    Example: ``gpu1`` (8 GPUs, 0-5 taken) and ``gpu2`` (8, all free); a job of 1 node × 4 GPUs
    gets ``{"u@gpu2:22": (0, 1, 2, 3)}``; one of 1 × 2 gets ``{"u@gpu1:22": (6, 7)}``.
    """
    def free_on(h: SshHost) -> list[int]:
        return sorted(free.get(host_key(h), range(h.gpus)))

    busy = {host_key(h) for h in site.hosts if len(free_on(h)) < gpus_per_node}
    chosen = reserve_hosts(site, nodes, gpus_per_node, busy, job=job)
    return {host_key(h): tuple(free_on(h)[:gpus_per_node]) for h in chosen.hosts}


def held_hosts(site: Site, gpus: Mapping[str, Sequence[int]]) -> tuple[SshHost, ...]:
    """The hosts of ``site`` named in ``gpus`` (``host_key`` → indices, as ``pick_gpus`` returns them), in its order."""
    by_key = {host_key(h): h for h in site.hosts}
    missing = [k for k in gpus if k not in by_key]
    if missing:
        raise ValueError(f"site {site.name} lists no host {', '.join(missing)}")
    return tuple(by_key[k] for k in gpus)


def visible_devices(gpus: Mapping[str, Sequence[int]] | None, host: SshHost, *,
                    cpu_only: bool = False) -> dict[str, str]:
    """The environment that limits a job on ``host`` to its held GPUs (empty: it holds none there). A CPU job
    (``cpu_only``: ``resources.gpus: 0``, which holds none) sees no GPU at all, so it never trains on one
    another job holds."""
    if not gpus or host_key(host) not in gpus:
        return {"CUDA_VISIBLE_DEVICES": ""} if cpu_only else {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus[host_key(host)])}
