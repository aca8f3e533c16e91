"""SiteBlock: a site's configuration and credentials as a Prefect Block (secrets as SecretStr)."""

from __future__ import annotations

from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from hybridtrain.specs.secrets import SiteSecret, SiteSecrets
from hybridtrain.specs.sites import Site, SitesCatalog
from hybridtrain.workspace import Workspace


class SiteBlock(Block):
    """One hybridtrain site: where it is, what it has and costs, its work pool, store and credentials."""

    _block_type_name = "hybridtrain Site"
    _block_type_slug = "hybridtrain-site"
    _description = "A place hybridtrain can run stages: on-prem GPU cluster or cloud region."

    name: str = Field(description="Site name used in job specs and policies.")
    kind: Literal["onprem", "cloud"]
    region: str
    jurisdiction: str
    gpu_type: str | None = None
    gpu_count: int = 0
    capacity_class: Literal["fixed", "burst", "opportunistic"] = "fixed"
    price_per_gpu_hour: float | None = None
    spot_price_per_gpu_hour: float | None = None
    onprem_cost: dict[str, float] | None = Field(None, description="Amortization inputs (see sites.yaml).")
    egress_per_gb: float = 0.0
    bandwidth_mbps: float = 1000.0
    work_pool: str
    store: dict[str, Any] = Field(description="kind: local (path) or s3 (bucket, prefix, endpoint_url, region).")
    hosts: list[dict[str, Any]] = Field(default_factory=list, description="SSH hosts (hostname, port, username, gpus).")
    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    ssh_private_key: SecretStr | None = Field(None, description="PEM private key for the site's SSH hosts.")
    ssh_known_hosts: str | None = Field(None, description="Pinned host key lines (known_hosts format).")

    @classmethod
    def from_site(cls, site: Site) -> SiteBlock:
        data = site.model_dump(mode="json")
        store = dict(data["store"])
        secret = store.pop("secret_access_key", None)
        key_id = store.pop("access_key_id", None)
        data["store"] = store
        return cls(**data, aws_access_key_id=key_id, aws_secret_access_key=secret)

    def to_site(self) -> Site:
        store = dict(self.store)
        if store.get("kind") == "s3":
            store["access_key_id"] = self.aws_access_key_id
            if self.aws_secret_access_key is not None:
                store["secret_access_key"] = self.aws_secret_access_key.get_secret_value()
        fields = self.model_dump(
            include={"name", "kind", "region", "jurisdiction", "gpu_type", "gpu_count", "capacity_class",
                     "price_per_gpu_hour", "spot_price_per_gpu_hour", "onprem_cost", "egress_per_gb",
                     "bandwidth_mbps", "work_pool", "hosts"}
        )
        return Site.model_validate({**fields, "store": store})


def saved_site_blocks(names: list[str]) -> dict[str, SiteBlock]:
    """The saved blocks of the named sites, in one request (the server answers it with every block
    of the type; reading them by name took one request per site)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    wanted = set(names)
    with get_client(sync_client=True) as client:
        try:
            documents = client.read_block_documents_by_type(SiteBlock.get_block_type_slug(), include_secrets=True)
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code == 404:  # the block type is not registered yet: no site has a block
                return {}
            raise
    return {d.name: SiteBlock._load_from_block_document(d) for d in documents if d.name in wanted}


def load_site_secrets(names: list[str]) -> SiteSecrets:
    """Credentials of the named sites from their blocks (a site without a block has none)."""
    blocks = saved_site_blocks(names)
    return SiteSecrets.of({
        name: SiteSecret(aws_access_key_id=block.aws_access_key_id, aws_secret_access_key=block.aws_secret_access_key,
                         ssh_private_key=block.ssh_private_key, ssh_known_hosts=block.ssh_known_hosts)
        for name in names if (block := blocks.get(name)) is not None
    })


def with_site_secrets(ws: Workspace) -> Workspace:
    """The workspace carrying its sites' credentials from their blocks, in memory."""
    return ws.with_secrets(load_site_secrets(SitesCatalog.load(ws.sites_file).names))


def catalog_from_blocks(names: list[str]) -> SitesCatalog:
    """Build the sites catalog from saved SiteBlocks (e.g. on a worker without the YAML file)."""
    return SitesCatalog(apiVersion="hybridtrain/v1", sites=tuple(SiteBlock.load(n).to_site() for n in names))
