"""SiteBlock: a site's configuration and credentials as a Prefect Block (secrets as SecretStr)."""

from __future__ import annotations

from typing import Any

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
    config: dict[str, Any] = Field(description="The site as in deployments/sites.yaml (every field of the Site model, "
                                               "credentials excepted), validated by that model on load.")
    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    ssh_private_key: SecretStr | None = Field(None, description="PEM private key for the site's SSH hosts.")
    ssh_known_hosts: str | None = Field(None, description="Pinned host key lines (known_hosts format).")

    @classmethod
    def from_site(cls, site: Site) -> SiteBlock:
        """The block of ``site``: its whole config from the ``Site`` model (so no field can be dropped on the
        way), with the S3 keys moved out of the store section into secret fields."""
        data = site.model_dump(mode="json")
        store = dict(data["store"])
        store.pop("secret_access_key", None)  # dumped masked: the secret itself is read from the model below
        key_id = store.pop("access_key_id", None)
        data["store"] = store
        secret = getattr(site.store, "secret_access_key", None)
        return cls(name=site.name, config=data, aws_access_key_id=key_id, aws_secret_access_key=secret)

    def to_site(self) -> Site:
        data = dict(self.config)
        store = dict(data.get("store") or {})
        if store.get("kind") == "s3":
            store["access_key_id"] = self.aws_access_key_id
            if self.aws_secret_access_key is not None:
                store["secret_access_key"] = self.aws_secret_access_key.get_secret_value()
        return Site.model_validate({**data, "store": store})

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
