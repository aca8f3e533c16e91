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


def register_sites(catalog: SitesCatalog) -> list[str]:
    """Register the block type and save (overwrite) one SiteBlock per site; returns block names."""
    SiteBlock.register_type_and_schema()
    names = []
    for site in catalog.sites:
        SiteBlock.from_site(site).save(site.name, overwrite=True)
        names.append(site.name)
    return names
