"""Site: one place where stages can run — an on-prem GPU cluster or a cloud region — and the catalog of them.

A site says where it is (region, jurisdiction), what it has (GPU type and count, capacity
class), what it costs (price per GPU-hour — amortized for on-prem — and egress per GB), which
Prefect work pool runs its work, where its object store lives and how to reach its hosts.
The catalog is ``deployments/sites.yaml``; the same fields can be stored as Prefect Blocks.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.config_file import load_model

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
# A site store's layout: DVC objects under one prefix, checkpoints and artifacts under another.
DVC_SUBDIR = "dvc"
CHECKPOINT_SUBDIR = "objects"
DVC_S3_CONNECT_TIMEOUT_S = 10
DVC_S3_READ_TIMEOUT_S = 120
#: Bounds a value must stay within to be a real site and keep every cost and time finite.
MAX_PRICE_PER_GPU_HOUR = 1000.0  # USD; the dearest cloud GPU rents for well under $100/h
MAX_EGRESS_PER_GB = 1000.0  # USD
MIN_BANDWIDTH_MBPS = 1.0  # below this a value is more likely Gbit/s or bytes than a GPU site's link
MAX_BANDWIDTH_MBPS = 10_000_000.0  # 10 Tbit/s
MAX_GPU_COUNT = 1_000_000
# An S3 bucket name (AWS general purpose bucket rules, which MinIO and Ceph follow for DNS-style access):
# 3-63 characters, lowercase letters, digits, '.' and '-', beginning and ending with a letter or digit.
S3_BUCKET_RE = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SiteKind(StrEnum):
    onprem = "onprem"
    cloud = "cloud"


class CapacityClass(StrEnum):
    """How reliably capacity is there: owned (fixed), rented on demand (burst), or spot (opportunistic)."""

    fixed = "fixed"
    burst = "burst"
    opportunistic = "opportunistic"


class OnPremCost(Strict):
    """What an owned GPU costs per hour once capex, lifetime, power and utilization are counted."""

    capex_per_gpu_usd: FiniteFloat = Field(gt=0, description="Purchase price per GPU incl. its share of the server.")
    lifetime_years: FiniteFloat = Field(gt=0, description="Depreciation period.")
    power_kw_per_gpu: FiniteFloat = Field(ge=0, description="Average draw per GPU incl. cooling overhead (PUE).")
    power_price_per_kwh: FiniteFloat = Field(ge=0)
    utilization: FiniteFloat = Field(gt=0, le=1, description="Share of hours the GPU does paid-for work.")
    opex_per_gpu_year_usd: FiniteFloat = Field(0.0, ge=0, description="Support, space, staff per GPU and year.")

    @model_validator(mode="after")
    def _a_price(self) -> OnPremCost:
        price = self.price_per_gpu_hour()
        if not price <= MAX_PRICE_PER_GPU_HOUR:  # also catches an overflow to inf
            shown = f"${price:,.2f}" if price < 1e9 else f"${price:.3g}"
            raise ValueError(f"these numbers price a GPU-hour at {shown} (over ${MAX_PRICE_PER_GPU_HOUR:,.0f}): "
                             "check capex_per_gpu_usd (USD per GPU), lifetime_years (years, not hours) and "
                             "utilization (a share, e.g. 0.65)")
        return self

    def price_per_gpu_hour(self) -> float:
        hours = self.lifetime_years * 365 * 24
        capital = (self.capex_per_gpu_usd + self.opex_per_gpu_year_usd * self.lifetime_years) / hours
        return capital / self.utilization + self.power_kw_per_gpu * self.power_price_per_kwh


class LocalStore(Strict):
    """A directory standing in for a site's object store (embedded default)."""

    kind: Literal["local"] = "local"
    path: str = Field(description="Directory; relative paths are relative to the workspace root.")

    @field_validator("path")
    @classmethod
    def _confined(cls, v: str) -> str:
        p = Path(v)
        if ".." in p.parts:
            raise ValueError("must not contain '..': give the store directory itself (absolute, or relative to the "
                             "workspace root)")
        if not v.strip() or not p.parts or (p.is_absolute() and p == Path(p.anchor)):
            where = "the workspace root itself" if not p.is_absolute() else "the file system root"
            raise ValueError(f"{v!r} would make the store {where}: give a directory of its own, e.g. "
                             ".hybridtrain/stores/<site name>")
        return v


class S3Store(Strict):
    """An S3-compatible bucket (AWS, MinIO, Ceph...)."""

    kind: Literal["s3"] = "s3"
    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = ""
    endpoint_url: str | None = Field(None, description="Omit for AWS; set for MinIO/Ceph/moto.")
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, v: str) -> str:
        rules = ("S3 bucket names are 3-63 lowercase letters, digits, '.' and '-', begin and end with a letter or "
                 "digit, and are not an IP address: give the bucket's name as the store shows it, e.g. ml-data")
        if not re.match(S3_BUCKET_RE, v):
            raise ValueError(f"{v!r} is not an S3 bucket name; {rules}")
        if ".." in v or ".-" in v or "-." in v:
            raise ValueError(f"{v!r} is not an S3 bucket name: no '..', '.-' or '-.' inside; {rules}")
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            pass
        else:
            raise ValueError(f"{v!r} is an IP address, not an S3 bucket name; {rules}")
        reserved = [x for x in S3_RESERVED_PREFIXES if v.startswith(x)] + \
                   [x for x in S3_RESERVED_SUFFIXES if v.endswith(x)]
        if reserved:
            raise ValueError(f"{v!r} is not an S3 bucket name: {reserved[0]!r} is reserved by S3; give the bucket's "
                             "own name")
        return v


Store = Annotated[LocalStore | S3Store, Field(discriminator="kind")]


def ssh_word(v: str, info: ValidationInfo) -> str:
    """A hostname or SSH login: not empty, one word, nothing ssh could read as an option or a user@ prefix."""
    what = {"hostname": "the host's DNS name or IP address, e.g. gpu1.dc.example.com",
            "username": "the SSH login on the host, e.g. train"}[info.field_name]
    if not v.strip():
        raise ValueError(f"must not be empty: give {what}")
    if any(c.isspace() for c in v) or v.startswith("-") or "@" in v:
        raise ValueError(f"{v!r} is not a {info.field_name} (no spaces or '@', no leading '-'): give {what}")
    return v


class SshHost(Strict):
    """An on-prem host reachable over SSH (key auth, host key pinned in known_hosts)."""

    hostname: str = Field(description="DNS name or IP address the control plane reaches the host on.")
    port: int = Field(22, ge=1, le=65535)
    username: str = Field(description="SSH login on the host.")
    gpus: int = Field(0, ge=0, le=MAX_GPU_COUNT, description="GPUs of this host the site's jobs may use.")
    workdir: str = Field("~/hybridtrain", description="Where job bundles are unpacked on the host.")
    python: str = Field("python3", description="Interpreter on the host with hybridtrain installed.")
    connect_timeout_s: FiniteFloat = Field(10.0, gt=0, description="TCP connect, banner, auth, opening a channel.")
    command_timeout_s: FiniteFloat = Field(60.0, gt=0, description="One short command or SFTP operation.")
    reconnect_s: FiniteFloat = Field(
        60.0, gt=0, description="How long a dropped link to a running job is retried before the site counts as lost.")

    @field_validator("hostname", "username")
    @classmethod
    def _one_word(cls, v: str, info: ValidationInfo) -> str:
        return ssh_word(v, info)


INSTANCE_ID_FIELD = "{instance_id}"


class CloudInstances(Strict):
    """How a cloud site starts machines for a multi-node job: an EC2 (or EC2-compatible) API, an image, an SSH login.

    A job of ``resources.nodes: N`` placed at the site starts N instances of ``image_id``, trains
    on them over SSH like on-prem hosts, and terminates them afterwards. The image must hold
    hybridtrain (``python``) and a baked SSH host key (``host_key``), so the key every started
    instance shows is known before it boots — never trusted on first use.
    """

    provider: Literal["ec2"] = Field("ec2", description="The API that starts instances (boto3 EC2 client).")
    region: str = Field(min_length=1, description="Region the instances start in, e.g. eu-west-1.")
    endpoint_url: str | None = Field(None, description="Omit for AWS; set for another EC2-compatible API.")
    image_id: str = Field(min_length=1, description="Machine image (AMI) with hybridtrain and a baked SSH host key.")
    instance_type: str = Field(min_length=1, description="e.g. p4d.24xlarge.")
    gpus_per_instance: int = Field(0, ge=0, description="GPUs one instance has (a job's per-node GPUs must fit).")
    subnet_id: str | None = Field(None, description="Subnet to start in (the instances reach each other and the "
                                                    "control plane reaches them on their private addresses).")
    security_group_ids: tuple[str, ...] = Field((), description="Security groups (SSH and the rendezvous open "
                                                                "between the instances).")
    key_name: str | None = Field(None, description="EC2 key pair authorized on the instances; the site block "
                                                   "holds its private key (ssh_private_key).")
    username: str = Field(min_length=1, description="SSH login on the image.")
    port: int = Field(22, ge=1, le=65535)
    workdir: str = Field("~/hybridtrain", description="Where job bundles are unpacked; {instance_id} is replaced "
                                                      "by the instance's id.")
    python: str = Field("python3", description="Interpreter on the image with hybridtrain installed.")
    host_key: str = Field(description="The image's SSH host public key, one line: 'ssh-ed25519 AAAA...'.")
    max_instances: int = Field(8, ge=1, description="Most instances one job may start at this site.")
    boot_timeout_s: FiniteFloat = Field(600.0, gt=0, description="How long all instances may take to run and "
                                                                 "answer on SSH before they are terminated.")
    connect_timeout_s: FiniteFloat = Field(10.0, gt=0, description="TCP connect, banner, auth, opening a channel.")
    command_timeout_s: FiniteFloat = Field(60.0, gt=0, description="One short command or SFTP operation.")
    reconnect_s: FiniteFloat = Field(
        60.0, gt=0, description="How long a dropped link to a running job is retried before the site counts as lost.")

    @field_validator("host_key")
    @classmethod
    def _one_public_key(cls, v: str) -> str:
        parts = v.split()
        fix = ("give the image's host public key as one line 'ssh-ed25519 AAAA...' (the contents of "
               "/etc/ssh/ssh_host_ed25519_key.pub baked into the image)")
        if len(parts) < 2 or not re.match(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+)$", parts[0]):
            raise ValueError(f"not an SSH public key: {fix}")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"the key is not valid base64: {fix}") from None
        if not blob.startswith(len(parts[0]).to_bytes(4, "big") + parts[0].encode()):
            raise ValueError(f"the key's type does not match its data: {fix}")
        return f"{parts[0]} {parts[1]}"

    @field_validator("username")
    @classmethod
    def _one_word(cls, v: str, info: ValidationInfo) -> str:
        return ssh_word(v, info)

    @field_validator("workdir")
    @classmethod
    def _placeholder(cls, v: str) -> str:
        rest = v.replace(INSTANCE_ID_FIELD, "")
        if "{" in rest or "}" in rest:
            raise ValueError(f"the only placeholder a workdir may hold is {INSTANCE_ID_FIELD}")
        return v


class Site(Strict):
    """One environment: its place, its GPUs, its prices, its work pool, its store and its hosts."""

    name: str = Field(pattern=NAME_RE, description="Unique site name, used in specs and policies.")
    kind: SiteKind
    region: str = Field(description="Where the site is, e.g. eu-west-1 or eu-central.")
    jurisdiction: str = Field(description="Legal area for residency rules, e.g. EU, UK, US.")
    gpu_type: str | None = Field(None, description="e.g. A100, H100, V100; None for CPU-only sites.")
    gpu_count: int = Field(0, ge=0, le=MAX_GPU_COUNT, description="GPUs the site can give this platform at once "
                                                                  "(a cloud site: the most it may rent at once).")
    capacity_class: CapacityClass = CapacityClass.fixed
    price_per_gpu_hour: FiniteFloat | None = Field(
        None, ge=0, le=MAX_PRICE_PER_GPU_HOUR,
        description="Cloud list price; on-prem sites may give onprem_cost instead.",
    )
    spot_price_per_gpu_hour: FiniteFloat | None = Field(None, ge=0, le=MAX_PRICE_PER_GPU_HOUR)
    onprem_cost: OnPremCost | None = None
    egress_per_gb: FiniteFloat = Field(0.0, ge=0, le=MAX_EGRESS_PER_GB, description="USD per GB leaving this site.")
    bandwidth_mbps: FiniteFloat = Field(1000.0, ge=MIN_BANDWIDTH_MBPS, le=MAX_BANDWIDTH_MBPS,
                                        description="Sustained transfer rate to other sites, megabits per second.")
    work_pool: str = Field(pattern=NAME_RE, description="Prefect work pool that runs this site's work.")
    store: Store
    hosts: tuple[SshHost, ...] = ()
    instances: CloudInstances | None = Field(
        None, description="Cloud sites: how to start instances for multi-node jobs (resources.nodes > 1).")

    @field_validator("region", "jurisdiction", "gpu_type")
    @classmethod
    def _not_blank(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not v.strip():
            fix = {"region": "give where the site is, e.g. eu-west-1",
                   "jurisdiction": "give its legal area, e.g. EU (residency rules and policy jurisdictions match it)",
                   "gpu_type": "give the GPU model, e.g. A100, or leave gpu_type out for a CPU-only site"}
            raise ValueError(f"must not be empty: {fix[info.field_name]}")
        return v

    @field_validator("gpu_count")
    @classmethod
    def _gpus_of_a_gpu_site(cls, v: int, info: ValidationInfo) -> int:
        gpu_type = info.data.get("gpu_type")
        if v == 0 and gpu_type:
            raise ValueError(f"0 GPUs at a site with gpu_type {gpu_type} refuses every GPU job there (a cloud site "
                             "too: gpu_count is the most GPUs the platform may use there at once, not 'elastic'): "
                             "give that number, e.g. 16, or leave gpu_type out for a CPU-only site")
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts_fit(cls, hosts: tuple[SshHost, ...], info: ValidationInfo) -> tuple[SshHost, ...]:
        seen: dict[tuple[str, int], int] = {}
        for i, h in enumerate(hosts):
            key = (h.hostname.lower(), h.port)
            if key in seen:
                raise ValueError(f"hosts[{i}] ({h.hostname}:{h.port}) repeats hosts[{seen[key]}]: list each machine "
                                 "once (its GPUs would be counted twice)")
            seen[key] = i
        gpu_count = info.data.get("gpu_count")
        if gpu_count is not None:
            for i, h in enumerate(hosts):
                if h.gpus > gpu_count:
                    raise ValueError(f"hosts[{i}] ({h.hostname}) has gpus: {h.gpus}, more than the site's gpu_count "
                                     f"{gpu_count} (the GPUs it gives this platform at once): give the GPUs the host "
                                     "has for these jobs, or raise gpu_count")
        return hosts

    @model_validator(mode="after")
    def _priced(self) -> Site:
        if self.price_per_gpu_hour is None and self.onprem_cost is None:
            raise ValueError("give price_per_gpu_hour or onprem_cost so the site's GPU-hour has a price")
        if self.onprem_cost is not None and self.kind is not SiteKind.onprem:
            raise ValueError("onprem_cost applies to kind: onprem sites only")
        if self.instances is not None and self.kind is not SiteKind.cloud:
            raise ValueError(f"sites.{self.name}.instances applies to kind: cloud sites only: remove it, or list "
                             "this site's machines under hosts")
        if self.instances is not None and self.hosts:
            raise ValueError(f"site {self.name} gives both hosts and instances: a multi-node job either runs on the "
                             "listed hosts or starts instances; keep one")
        return self

    @property
    def gpu_hour_price(self) -> float:
        """Price per GPU-hour in USD: amortized for on-prem, list price for cloud."""
        if self.onprem_cost is not None:
            return self.onprem_cost.price_per_gpu_hour()
        assert self.price_per_gpu_hour is not None
        return self.price_per_gpu_hour

    @property
    def dvc_remote(self) -> str:
        """Name of the DVC remote that is this site's store."""
        return self.name

    def store_url(self, root: Path) -> str:
        """URL of the site's store: an absolute directory, or s3://bucket/prefix."""
        if isinstance(self.store, LocalStore):
            p = Path(self.store.path)
            return str(p if p.is_absolute() else (root / p).resolve())
        prefix = self.store.prefix.strip("/")
        return f"s3://{self.store.bucket}/{prefix}" if prefix else f"s3://{self.store.bucket}"

    def dvc_remote_config(self, root: Path, subdir: str = "dvc") -> dict[str, str]:
        """This site's store as a DVC remote section, without secrets (safe to write to DVC config).

        Local: ``{"url": "<store dir>/dvc"}``. S3: ``{"url": "s3://bucket/prefix/dvc",
        "endpointurl": ..., "region": ..., "connect_timeout": ..., "read_timeout": ...}`` (dvc-s3
        option names; the timeouts keep a push to an unreachable endpoint from hanging).
        """
        conf = {"url": f"{self.store_url(root)}/{subdir}" if subdir else self.store_url(root)}
        if isinstance(self.store, S3Store):
            if self.store.endpoint_url:
                conf["endpointurl"] = self.store.endpoint_url
            conf["region"] = self.store.region
            conf["connect_timeout"] = str(DVC_S3_CONNECT_TIMEOUT_S)
            conf["read_timeout"] = str(DVC_S3_READ_TIMEOUT_S)
        return conf

    def dvc_remote_secrets(self) -> dict[str, str]:
        """The store's credentials as DVC remote options; keep them in memory, never in a config file."""
        if not isinstance(self.store, S3Store):
            return {}
        out: dict[str, str] = {}
        if self.store.access_key_id:
            out["access_key_id"] = self.store.access_key_id
        if self.store.secret_access_key is not None:
            out["secret_access_key"] = self.store.secret_access_key.get_secret_value()
        return out


class SitesCatalog(Strict):
    """All sites of a deployment (``deployments/sites.yaml``)."""

    apiVersion: Literal["hybridtrain/v1"]
    kind: Literal["SitesCatalog"] = "SitesCatalog"
    sites: tuple[Site, ...] = Field(min_length=1)

    @field_validator("sites")
    @classmethod
    def _unique(cls, sites: tuple[Site, ...]) -> tuple[Site, ...]:
        seen: set[str] = set()
        for s in sites:
            if s.name in seen:
                raise ValueError(f"site name {s.name!r} appears twice; names must be unique")
            seen.add(s.name)
        return sites

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sites]

    def get(self, name: str) -> Site:
        for s in self.sites:
            if s.name == name:
                return s
        raise SpecError(
            "sites catalog",
            [Problem("sites", f"no site named {name!r}; known sites: {', '.join(self.names)}")],
        )

    def by_pool(self, pool: str) -> list[Site]:
        return [s for s in self.sites if s.work_pool == pool]

    @property
    def pools(self) -> list[str]:
        return sorted({s.work_pool for s in self.sites})

    @classmethod
    def load(cls, path: Path | str) -> SitesCatalog:
        return load_model(cls, path)


def is_valid_name(name: str) -> bool:
    return re.match(NAME_RE, name) is not None
