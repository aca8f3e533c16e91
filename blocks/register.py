"""Block registration: save every site as a SiteBlock and make sure the pseudonym key exists (idempotent)."""

from __future__ import annotations

import io
import os
import secrets
from pathlib import Path

import paramiko
from prefect.blocks.system import Secret

from blocks.site import SiteBlock
from hybridtrain.errors import Problem, SpecError
from hybridtrain.remote.ssh_site import known_hosts_name, load_private_key, parse_known_hosts
from hybridtrain.specs.sites import S3Store, Site, SitesCatalog


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
    """Store credentials in a site's block (fields: SECRET_FIELDS); returns the fields changed.

    Each value is checked first (``credential_problems``): a ``SpecError`` naming every field that does
    not fit the site or is not what it claims, and nothing is stored."""
    block = SiteBlock.load(site)
    changed = {k: v for k, v in values.items() if v is not None}
    unknown = set(changed) - set(SECRET_FIELDS)
    if unknown:
        raise ValueError(f"unknown credential field(s) {sorted(unknown)}; use {', '.join(SECRET_FIELDS)}")
    problems = credential_problems(block.to_site(), **changed)
    if problems:
        raise SpecError(f"credentials of site {site}", problems)
    SiteBlock.model_validate({**block.model_dump(), **changed}).save(site, overwrite=True)
    return sorted(changed)


def credential_problems(site: Site, **values: str | None) -> list[Problem]:
    """What is wrong with storing ``values`` (fields: SECRET_FIELDS) in ``site``'s block; [] when nothing is.

    Each field must fit the site — an SSH key one with SSH hosts or instances, known_hosts one with SSH
    hosts (the instances' host key is pinned in the catalog), AWS keys one with an S3 store or instances —
    and hold what it claims: a private key the SSH hosts are reached with (``ssh_site.load_private_key``:
    OpenSSH or PEM, no passphrase, since no one is there to type it), known_hosts lines that parse and pin
    every host of the site, a key id and secret that are not empty. A field given as None (its file could
    not be read) is checked for fit only. Messages never echo a value: it is a secret even when invalid.
    """
    problems: list[Problem] = []
    for field, value in values.items():
        message = _misfit(site, field) or (None if value is None else _CHECKS[field](site, value))
        if message:
            problems.append(Problem(field, message))
    return problems


def _misfit(site: Site, field: str) -> str | None:
    """Why ``site`` uses no such credential, or None when it does."""
    name, catalog = site.name, f"sites.{site.name}"
    if field == "ssh_private_key" and not site.hosts and site.instances is None:
        return (f"site {name} has no SSH hosts and starts no instances, so it uses no SSH key: list its hosts under "
                f"{catalog}.hosts in the sites catalog first, or store the key for the site that has them")
    if field == "ssh_known_hosts" and not site.hosts:
        if site.instances is not None:
            return (f"site {name} has no SSH hosts: the host key of the instances it starts is pinned in "
                    f"{catalog}.instances.host_key, so no known_hosts is used there; leave it out")
        return (f"site {name} has no SSH hosts, so it uses no known_hosts: list its hosts under {catalog}.hosts in "
                "the sites catalog first, or store the file for the site that has them")
    if field in ("aws_access_key_id", "aws_secret_access_key") and not isinstance(site.store, S3Store) \
            and site.instances is None:
        return (f"site {name} keeps its store in a local directory ({catalog}.store.kind: local) and starts no "
                "instances, so it uses no AWS credentials: leave them out, or store them for a site whose store "
                "has kind: s3")
    return None


def _check_private_key(site: Site, text: str) -> str | None:
    try:
        load_private_key(text)  # what connecting to the hosts will do with it
        return None
    except SpecError:
        pass
    first = text.split(None, 1)[0] if text.split() else ""
    if "PRIVATE KEY" not in text and first.startswith(("ssh-", "ecdsa-", "sk-")):
        return "this is a public key: give the private key (the file of the same name without .pub)"
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            cls.from_private_key(io.StringIO(text))
        except paramiko.PasswordRequiredException:
            return ("the key is protected by a passphrase, and jobs reach the hosts with no one there to type it: "
                    "store a copy without one (`cp KEY KEY.plain && ssh-keygen -p -N '' -f KEY.plain`, then give "
                    "KEY.plain and delete it); the site block is encrypted at rest")
        except (paramiko.SSHException, ValueError, TypeError, IndexError):
            continue
    return ("not a private key hybridtrain can use: give an OpenSSH or PEM Ed25519, ECDSA or RSA private key (a "
            "text file beginning '-----BEGIN', e.g. ~/.ssh/id_ed25519)")


#: Problems of a known_hosts file listed in one message; the rest are counted.
SHOWN_KNOWN_HOSTS_PROBLEMS = 3


def _check_known_hosts(site: Site, text: str) -> str | None:
    try:
        pairs = parse_known_hosts(text)  # what connecting to the hosts will do with it
    except SpecError as exc:
        shown = [f"line {p.line}: {p.message}" if p.line is not None else p.message
                 for p in exc.problems[:SHOWN_KNOWN_HOSTS_PROBLEMS]]
        more = len(exc.problems) - len(shown)
        return (f"{'; '.join(shown)}{f' (and {more} more)' if more > 0 else ''}: give lines "
                "'host keytype base64key', as ~/.ssh/known_hosts holds them")
    if not pairs:
        return "holds no host key lines: give a line 'host keytype base64key' for each SSH host of the site"
    pinned = paramiko.HostKeys()
    for pattern, key in pairs:
        pinned.add(pattern, key.get_name(), key)
    # Connecting looks a host up by this name only (hashed lines match it too): an unpinned host is refused.
    missing = [h for h in site.hosts if pinned.lookup(known_hosts_name(h.hostname, h.port)) is None]
    if missing:
        names = ", ".join(known_hosts_name(h.hostname, h.port) for h in missing)
        return (f"pins no key for {names} (SSH host{'s' if len(missing) > 1 else ''} of site {site.name}), and a "
                f"host whose key is not pinned is refused: add a line for each, e.g. from `ssh-keyscan -p "
                f"{missing[0].port} {missing[0].hostname}` checked against the host's own fingerprint")
    return None


def _check_key_id(site: Site, value: str) -> str | None:
    if not value.strip():
        return "is empty: give the access key id of the site's S3 store (or of the EC2 API that starts its instances)"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "holds spaces or control characters: an access key id is one word, e.g. AKIA..."
    return None


def _check_secret(site: Site, value: str) -> str | None:
    if not value.strip():
        return "is empty: put the secret access key in the file"
    if value != value.strip() or not value.isprintable():
        return "holds more than the key (a line break, spaces around it or control characters): give only the key"
    return None


_CHECKS = {"ssh_private_key": _check_private_key, "ssh_known_hosts": _check_known_hosts,
           "aws_access_key_id": _check_key_id, "aws_secret_access_key": _check_secret}
