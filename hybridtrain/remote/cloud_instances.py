"""CloudFleet: the instances one multi-node job starts at a cloud site — all or none, reached over SSH, always terminated.

A cloud site that declares ``instances:`` in ``sites.yaml`` (``specs.sites.CloudInstances``) runs a
job of ``resources.nodes: N`` on N instances it starts for that job alone. An example, site
``cloud-eu``, two nodes, job id ``churn-r7``:

1. ``terminate_orphans(site, "churn-r7")`` finds instances tagged ``hybridtrain:job=churn-r7``
   and ``hybridtrain:site=cloud-eu`` that are still up — left by an attempt whose process was
   killed before it could clean up — and terminates them, so a resumed attempt never pays for
   the old one's machines.
2. ``provision(site, 2, "churn-r7")`` calls EC2 ``RunInstances`` once with ``MinCount=MaxCount=2``
   (spot market options when the site's capacity class is ``opportunistic``), both tags and a
   fresh client token (a retried call never starts a second pair). It waits for both with the
   ``instance_running`` waiter, reads their private addresses, and waits until each SSH port
   answers with an SSH banner — all within ``boot_timeout_s``.
3. It returns a ``Fleet``: the instance ids, one ``SshHost`` per instance (``workdir`` with
   ``{instance_id}`` filled in) and the known_hosts lines pinning ``instances.host_key`` at
   each address. The caller trains on ``fleet.hosts`` (``multinode_training.ssh_train_nodes``,
   instance 0 serving the rendezvous) inside ``with fleet:``, which terminates every instance
   when training ends, fails or is interrupted.
4. Only one of the two answers in time (the other is stuck booting): both are terminated and
   ``SiteUnavailable`` says "asked for 2, 1 came up", the instance that did not and what to do.
   EC2 refusing the request for lack of capacity is ``SiteUnavailable`` too (place it elsewhere);
   a wrong image, subnet or key pair is a ``SpecError`` naming ``sites.<site>.instances.<field>``.

5. An instance nothing will terminate — its control plane killed and the run never resumed — is
   found by ``sweep_orphans(site, run_ended)``, which the scheduled ``recover-runs`` flow calls for
   every site with ``instances:``: ``provision`` tags each instance with the MLflow run it trains
   for (``hybridtrain:mlflow-run``) and a deadline (``hybridtrain:expires``: boot time plus the
   job's ``max_hours`` plus a grace), and the sweep terminates every live instance of the site
   whose run has ended (FINISHED, FAILED or KILLED) or whose deadline has passed.

Credentials: the site block's AWS keys (``Ec2Credentials``), or boto3's standard chain (environment,
profile, instance role) when the block holds none.
"""

from __future__ import annotations

import logging
import math
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, WaiterError
from pydantic import SecretStr

from hybridtrain.errors import Problem, SiteUnavailable, SpecError
from hybridtrain.remote.ssh_site import known_hosts_name
from hybridtrain.specs.sites import INSTANCE_ID_FIELD, CapacityClass, CloudInstances, Site, SshHost

log = logging.getLogger(__name__)

JOB_TAG = "hybridtrain:job"
SITE_TAG = "hybridtrain:site"
RUN_TAG = "hybridtrain:mlflow-run"
EXPIRES_TAG = "hybridtrain:expires"
#: States of an instance that still runs, or may run again, and so must be terminated.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
#: How often the SSH ports and the waiter poll (seconds; a short boot timeout polls faster).
POLL_S = 5.0
API_TIMEOUT_S = 30
_SPEC_ERRORS = {  # EC2 error code prefix → the instances field a person fixes
    "InvalidAMIID": "image_id",
    "InvalidSubnetID": "subnet_id",
    "InvalidSubnet": "subnet_id",
    "InvalidKeyPair": "key_name",
    "InvalidGroup": "security_group_ids",
    "InvalidInstanceType": "instance_type",
}
_CREDENTIAL_ERRORS = ("AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch")


@dataclass(frozen=True)
class Ec2Credentials:
    """The AWS keys a site block holds for its EC2 API (None: boto3's standard chain)."""

    access_key_id: str
    secret_access_key: SecretStr


def ec2_client(site: Site, credentials: Ec2Credentials | None = None) -> Any:
    """A boto3 EC2 client for the site's ``instances`` API, with bounded timeouts and standard retries."""
    fleet = _instances(site)
    keys = {} if credentials is None else {
        "aws_access_key_id": credentials.access_key_id,
        "aws_secret_access_key": credentials.secret_access_key.get_secret_value()}
    return boto3.client("ec2", region_name=fleet.region, endpoint_url=fleet.endpoint_url, **keys,
                        config=Config(connect_timeout=10, read_timeout=API_TIMEOUT_S,
                                      retries={"mode": "standard", "max_attempts": 5}))


@dataclass
class Fleet:
    """Instances started for one job: their ids, the SSH hosts they are, and the known_hosts lines that pin them.

    ``hosts[i]`` is instance ``instance_ids[i]``; ``hosts[0]`` serves the rendezvous. Use it as a
    context manager (or call ``terminate``) so the instances never outlive the job.
    """

    site: str
    job_id: str
    instance_ids: tuple[str, ...]
    hosts: tuple[SshHost, ...]
    known_hosts: str
    client: Any = field(repr=False)
    terminated: bool = False
    spot: bool = False  # spot instances (else on-demand)

    def terminate(self) -> list[str]:
        """Terminate every instance of the fleet (idempotent); returns their ids."""
        if not self.terminated and self.instance_ids:
            _terminate(self.client, self.site, list(self.instance_ids))
        self.terminated = True
        return list(self.instance_ids)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.terminate()
        except SiteUnavailable:
            if exc is None:
                raise
            # The job's own failure is the one to report; the instances left up are named in the log.
            log.exception("job %s failed, and its instances could not be terminated", self.job_id)


def provision(site: Site, nodes: int, job_id: str, credentials: Ec2Credentials | None = None, *,
              spot: bool | None = None, client: Any = None, mlflow_run: str | None = None,
              expires_at: datetime | None = None) -> Fleet:
    """Start ``nodes`` instances at ``site`` for ``job_id`` and wait until each answers on SSH; all or none.

    ``spot`` (the placement's capacity class is ``opportunistic``; default: the site's) asks for spot
    instances. ``mlflow_run`` and ``expires_at`` tag the instances for ``sweep_orphans``.
    Raises ``SiteUnavailable`` when EC2 cannot start them or fewer than ``nodes`` are reachable
    within ``boot_timeout_s`` (every started instance is terminated first), ``SpecError`` when the
    ``instances`` block or the credentials are wrong.
    """
    fleet = _instances(site)
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if nodes > fleet.max_instances:
        raise SpecError("sites catalog", [Problem(
            f"sites.{site.name}.instances.max_instances",
            f"the job needs {nodes} instances and site {site.name} starts at most {fleet.max_instances}: raise "
            f"max_instances or set resources.nodes: {fleet.max_instances}")])
    ec2 = client if client is not None else ec2_client(site, credentials)
    deadline = time.monotonic() + fleet.boot_timeout_s
    tags = [{"Key": JOB_TAG, "Value": job_id}, {"Key": SITE_TAG, "Value": site.name},
            {"Key": "Name", "Value": f"hybridtrain-{job_id}"[:255]}]
    if mlflow_run:
        tags.append({"Key": RUN_TAG, "Value": mlflow_run})
    if expires_at is not None:
        tags.append({"Key": EXPIRES_TAG, "Value": expires_at.astimezone(UTC).isoformat(timespec="seconds")})
    request: dict[str, Any] = {
        "ImageId": fleet.image_id, "InstanceType": fleet.instance_type, "MinCount": nodes, "MaxCount": nodes,
        "ClientToken": uuid.uuid4().hex, "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}]}
    if fleet.subnet_id:
        request["SubnetId"] = fleet.subnet_id
    if fleet.security_group_ids:
        request["SecurityGroupIds"] = list(fleet.security_group_ids)
    if fleet.key_name:
        request["KeyName"] = fleet.key_name
    spot = spot if spot is not None else site.capacity_class is CapacityClass.opportunistic
    if spot:
        request["InstanceMarketOptions"] = {
            "MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time",
                                                  "InstanceInterruptionBehavior": "terminate"}}
    try:
        started = [i["InstanceId"] for i in ec2.run_instances(**request)["Instances"]]
    except ClientError as exc:
        raise _refused(site, nodes, exc) from None
    except BotoCoreError as exc:
        raise SiteUnavailable(site.name, f"its EC2 API did not answer ({exc}); nothing was started") from None
    log.info("site %s: started %s for job %s", site.name, ", ".join(started), job_id)
    try:
        addresses = _wait_running(ec2, site, started, deadline)
        missing = [i for i in started if not addresses.get(i)]
        if not missing:
            missing = _wait_ssh(addresses, fleet.port, deadline)
        if missing or len(started) < nodes:
            up = len(started) - len(missing)
            raise SiteUnavailable(site.name, (
                f"asked EC2 for {nodes} instances of {fleet.instance_type} for job {job_id}, {up} came up within "
                f"{fleet.boot_timeout_s:g} s (not running or not answering on SSH port {fleet.port}: "
                f"{', '.join(missing)}); all {len(started)} were terminated — retry later, raise "
                f"sites.{site.name}.instances.boot_timeout_s, check that the image starts sshd and this machine "
                "reaches the subnet, or place the job elsewhere"))
    except BaseException:
        try:
            _terminate(ec2, site.name, started)
        except SiteUnavailable:
            log.exception("site %s: the instances of job %s that did not all come up could not be terminated",
                          site.name, job_id)
        raise
    hosts = tuple(_host(fleet, instance, addresses[instance]) for instance in started)
    known = "".join(_known_host(h, fleet.host_key) for h in hosts)
    return Fleet(site=site.name, job_id=job_id, instance_ids=tuple(started), hosts=hosts, known_hosts=known,
                 client=ec2, spot=spot)


def terminate_orphans(site: Site, job_id: str, credentials: Ec2Credentials | None = None, *,
                      client: Any = None) -> list[str]:
    """Terminate the instances still up that an earlier attempt of ``job_id`` started at ``site``; their ids."""
    ec2 = client if client is not None else ec2_client(site, credentials)
    try:
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{JOB_TAG}", "Values": [job_id]}, {"Name": f"tag:{SITE_TAG}", "Values": [site.name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])
        orphans = [i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]]
    except (ClientError, BotoCoreError) as exc:
        raise SiteUnavailable(site.name, f"could not list the instances of job {job_id} on its EC2 API ({exc}); "
                                         "an earlier attempt's instances may still run") from None
    if orphans:
        log.warning("site %s: terminating %s, left running by an earlier attempt of job %s", site.name,
                    ", ".join(orphans), job_id)
        _terminate(ec2, site.name, orphans)
    return orphans


@dataclass(frozen=True)
class LiveInstance:
    """One of a site's instances that still runs (or may run again), as its tags describe it."""

    instance_id: str
    state: str
    instance_type: str
    job_id: str | None
    mlflow_run: str | None
    expires: datetime | None


@dataclass(frozen=True)
class Leftover:
    """A live instance that ``sweep_orphans`` terminated, and why."""

    instance_id: str
    job_id: str
    mlflow_run: str | None
    reason: str


def live_instances(site: Site, credentials: Ec2Credentials | None = None, *, client: Any = None) -> list[LiveInstance]:
    """The instances tagged with ``site`` that are not terminated yet (pending, running, stopping, stopped)."""
    ec2 = client if client is not None else ec2_client(site, credentials)
    try:
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{SITE_TAG}", "Values": [site.name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
    except (ClientError, BotoCoreError) as exc:
        raise SiteUnavailable(site.name, f"could not list its instances on its EC2 API ({exc}); leftover "
                                         "instances, if any, keep running until the next sweep") from None
    out = []
    for i in found:
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        out.append(LiveInstance(instance_id=i["InstanceId"], state=i.get("State", {}).get("Name", "?"),
                                instance_type=i.get("InstanceType", "?"), job_id=tags.get(JOB_TAG),
                                mlflow_run=tags.get(RUN_TAG), expires=_parse_time(tags.get(EXPIRES_TAG))))
    return out


def leftover_reason(instance: LiveInstance, run_status: str | None, now: datetime) -> str | None:
    """Why ``instance`` is left over (None: a job may still need it). ``run_status``: how its MLflow run ended
    (None: running, or unknown)."""
    if instance.expires is not None and now >= instance.expires:
        return f"past its deadline {instance.expires.isoformat(timespec='seconds')} (boot time + the job's max_hours)"
    if instance.mlflow_run and run_status:
        return f"its MLflow run {instance.mlflow_run} ended ({run_status})"
    return None


def sweep_orphans(site: Site, run_ended: Callable[[str], str | None], credentials: Ec2Credentials | None = None,
                  *, now: datetime | None = None, client: Any = None) -> list[Leftover]:
    """Terminate ``site``'s live instances that no running job needs; what was terminated, and why.

    An instance is left over when its ``hybridtrain:expires`` deadline has passed, or when
    ``run_ended(mlflow_run)`` names the end state of the MLflow run it was started for (None: the
    run is still running, or unknown — then only the deadline counts). Instances without our site
    tag are never looked at.
    """
    now = now or datetime.now(UTC)
    ec2 = client if client is not None else ec2_client(site, credentials)
    ended: dict[str, str | None] = {}
    found: list[Leftover] = []
    for instance in live_instances(site, client=ec2):
        run = instance.mlflow_run
        expired = instance.expires is not None and now >= instance.expires
        if run and not expired and run not in ended:
            ended[run] = run_ended(run)
        reason = leftover_reason(instance, ended.get(run) if run else None, now)
        if reason is not None:
            found.append(Leftover(instance.instance_id, instance.job_id or "?", run, reason))
    if found:
        for leftover in found:
            log.warning("site %s: terminating %s of job %s: %s", site.name, leftover.instance_id, leftover.job_id,
                        leftover.reason)
        _terminate(ec2, site.name, [x.instance_id for x in found])
    return found


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _instances(site: Site) -> CloudInstances:
    if site.instances is None:
        raise SpecError("sites catalog", [Problem(f"sites.{site.name}.instances",
                                                  f"site {site.name} declares no instances to start")])
    return site.instances


def _refused(site: Site, nodes: int, exc: ClientError) -> Exception:
    code = exc.response.get("Error", {}).get("Code", "")
    message = exc.response.get("Error", {}).get("Message", str(exc))
    for prefix, name in _SPEC_ERRORS.items():
        if code.startswith(prefix):
            return SpecError("sites catalog", [Problem(f"sites.{site.name}.instances.{name}",
                                                       f"EC2 refused it ({code}: {message}); fix the value")])
    if code in _CREDENTIAL_ERRORS:
        return SpecError("site credentials", [Problem(
            f"{site.name}.aws_access_key_id", f"EC2 refused the site's credentials ({code}: {message}): run "
            f"`hybridtrain credentials {site.name} --aws-access-key-id ID --aws-secret-access-key-file FILE` "
            "with keys allowed to run and terminate instances")])
    return SiteUnavailable(site.name, f"EC2 did not start {nodes} instances ({code}: {message}); nothing was "
                                      "started — retry later or place the job elsewhere")


def _wait_running(ec2: Any, site: Site, ids: list[str], deadline: float) -> dict[str, str | None]:
    """Instance id → private address of those running by ``deadline`` (None for the others)."""
    left = max(1.0, deadline - time.monotonic())
    delay = max(1, min(int(POLL_S), int(left / 10) or 1))
    try:
        ec2.get_waiter("instance_running").wait(
            InstanceIds=ids, WaiterConfig={"Delay": delay, "MaxAttempts": max(1, math.ceil(left / delay))})
    except WaiterError:
        pass  # some did not run in time (or failed to): the caller reports which
    found: dict[str, str | None] = dict.fromkeys(ids)
    try:
        pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=ids)
        for page in pages:
            for r in page["Reservations"]:
                for i in r["Instances"]:
                    if i["State"]["Name"] == "running":
                        found[i["InstanceId"]] = i.get("PrivateIpAddress")
    except (ClientError, BotoCoreError) as exc:
        raise SiteUnavailable(site.name, f"could not read the started instances ({exc}); they were "
                                         "terminated") from None
    return found


def _wait_ssh(addresses: dict[str, str | None], port: int, deadline: float) -> list[str]:
    """Ids of the instances whose SSH port did not answer with an SSH banner by ``deadline``."""
    waiting = {i: a for i, a in addresses.items() if a}
    while waiting:
        for instance, address in list(waiting.items()):
            if _answers_ssh(address, port):
                del waiting[instance]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_S, max(0.1, (deadline - time.monotonic()) / 10)))
    return list(waiting)


def _answers_ssh(address: str, port: int, timeout: float = 5.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _host(fleet: CloudInstances, instance_id: str, address: str) -> SshHost:
    return SshHost(hostname=address, port=fleet.port, username=fleet.username, gpus=fleet.gpus_per_instance,
                   workdir=fleet.workdir.replace(INSTANCE_ID_FIELD, instance_id), python=fleet.python,
                   connect_timeout_s=fleet.connect_timeout_s, command_timeout_s=fleet.command_timeout_s,
                   reconnect_s=fleet.reconnect_s)


def _known_host(host: SshHost, host_key: str) -> str:
    return f"{known_hosts_name(host.hostname, host.port)} {host_key}\n"


def _terminate(ec2: Any, site: str, ids: list[str]) -> None:
    try:
        ec2.terminate_instances(InstanceIds=ids)
    except (ClientError, BotoCoreError) as exc:
        raise SiteUnavailable(site, f"could not terminate instances {', '.join(ids)} ({exc}): terminate them in "
                                    "the cloud console, they are tagged " f"{JOB_TAG}") from None
    log.info("site %s: terminated %s", site, ", ".join(ids))
