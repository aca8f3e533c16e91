"""Block registration: save every site as a SiteBlock and make sure the pseudonym key exists (idempotent)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from prefect.blocks.system import Secret

from blocks.site import SiteBlock
from hybridtrain.specs.sites import SitesCatalog


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


def ensure_release_key(block_name: str, public_key_file: Path) -> bool:
    """Create the Ed25519 release signing key once (in a Secret block; never overwritten) and write
    its public half to ``public_key_file`` for release targets and the CLI. True when created."""
    from hybridtrain.governance.signing_key import SigningKey

    try:
        key = SigningKey.from_pem(Secret.load(block_name).get())
        created = False
    except ValueError:
        key = SigningKey.generate()
        Secret(value=key.to_pem().decode()).save(block_name)
        created = True
    public_key_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = public_key_file.with_suffix(".tmp")
    tmp.write_bytes(key.public.to_pem())
    os.replace(tmp, public_key_file)
    return created


def release_key_pem(block_name: str) -> str:
    try:
        return str(Secret.load(block_name).get())
    except ValueError:
        from hybridtrain.errors import Problem, SpecError

        raise SpecError("Prefect blocks", [Problem(block_name, "release signing key not found: run "
                                                               "`hybridtrain init` (or `make deploy`) to create it")]) from None


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
