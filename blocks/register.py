"""Block registration: save every site as a SiteBlock and make sure the pseudonym key exists (idempotent)."""

from __future__ import annotations

import secrets

from prefect.blocks.system import Secret

from blocks.site import SiteBlock
from hybridtrain.sites import SitesCatalog


def ensure_pseudonym_key(block_name: str) -> bool:
    """Create the keyed-pseudonym Secret once; never overwrite it (pseudonyms must stay stable).

    Returns True when a new key was created.
    """
    try:
        Secret.load(block_name)
        return False
    except ValueError:
        Secret(value=secrets.token_hex(32)).save(block_name)
        return True


SECRET_FIELDS = ("aws_access_key_id", "aws_secret_access_key", "ssh_private_key", "ssh_known_hosts")


def register_sites(catalog: SitesCatalog) -> list[str]:
    """Register the block type and save one SiteBlock per site from the catalog; returns block names.

    The catalog (git) wins for configuration; credentials already stored in a block are kept
    when the catalog has none (they are set with ``hybridtrain credentials``, never in YAML).
    """
    SiteBlock.register_type_and_schema()
    names = []
    for site in catalog.sites:
        block = SiteBlock.from_site(site)
        try:
            old = SiteBlock.load(site.name)
        except ValueError:
            old = None
        if old is not None:
            kept = {f: getattr(old, f) for f in SECRET_FIELDS if getattr(block, f) is None and getattr(old, f)}
            block = block.model_copy(update=kept)
        block.save(site.name, overwrite=True)
        names.append(site.name)
    return names


def set_credentials(site: str, **values: str | None) -> list[str]:
    """Store credentials in a site's block (fields: SECRET_FIELDS); returns the fields changed."""
    block = SiteBlock.load(site)
    changed = {k: v for k, v in values.items() if v is not None}
    unknown = set(changed) - set(SECRET_FIELDS)
    if unknown:
        raise ValueError(f"unknown credential field(s) {sorted(unknown)}; use {', '.join(SECRET_FIELDS)}")
    SiteBlock.model_validate({**block.model_dump(), **changed}).save(site, overwrite=True)
    return sorted(changed)
