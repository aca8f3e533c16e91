"""SiteSecrets: each site's credentials — S3 keys, SSH key and pinned host keys — held in memory only.

They come from the site's Prefect Block (``blocks.site.load_site_secrets``) or, outside Prefect,
from whoever builds them; they are merged into the sites catalog in memory (``apply``) and never
written to the YAML files, DVC config or logs (SecretStr keeps them out of reprs).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, SecretStr

from hybridtrain.specs.sites import S3Store, Site, SitesCatalog


class SiteSecret(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    ssh_private_key: SecretStr | None = None
    ssh_known_hosts: str | None = None

    @property
    def has_ssh(self) -> bool:
        return self.ssh_private_key is not None


class SiteSecrets(BaseModel):
    """Site name → its credentials."""

    model_config = ConfigDict(frozen=True)

    sites: dict[str, SiteSecret] = {}

    def get(self, site: str) -> SiteSecret | None:
        return self.sites.get(site)

    def apply(self, catalog: SitesCatalog) -> SitesCatalog:
        """The catalog with each S3 store's keys filled in from these secrets (YAML values win if set)."""
        return catalog.model_copy(update={"sites": tuple(self._apply(s) for s in catalog.sites)})

    def _apply(self, site: Site) -> Site:
        secret = self.sites.get(site.name)
        store = site.store
        if secret is None or not isinstance(store, S3Store):
            return site
        update: dict = {}
        if store.access_key_id is None and secret.aws_access_key_id:
            update["access_key_id"] = secret.aws_access_key_id
        if store.secret_access_key is None and secret.aws_secret_access_key is not None:
            update["secret_access_key"] = secret.aws_secret_access_key
        return site.model_copy(update={"store": store.model_copy(update=update)}) if update else site

    @classmethod
    def of(cls, mapping: Mapping[str, SiteSecret]) -> SiteSecrets:
        return cls(sites=dict(mapping))
