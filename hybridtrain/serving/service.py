"""ServingSetup: from a workspace and a release target's name to a ready ``ModelServer`` (what CLI and flow share).

The target comes from the job spec's ``promotion.release_targets`` (or, without a spec, from
the target specs recorded on the champion version). Which site serves follows the target's
kind: a ``directory`` target is an on-prem serving directory, so it serves on-prem (the
control site, or the first on-prem site); an ``object_store`` target is served from the site
whose store it is (the cloud site's pool). ``edge`` targets are not served over HTTP: the
device runs the package's ``score.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridtrain.errors import Problem, SpecError
from hybridtrain.workspace import Workspace

TARGET_SPECS_TAG = "hybridtrain.release.target_specs"


def trusted_key(ws: Workspace, public_key: Path | None) -> Any:
    """The release public key the server trusts: ``public_key`` or the workspace's copy."""
    from hybridtrain.governance.signing_key import VerifyKey

    path = Path(public_key) if public_key else ws.release_public_key
    try:
        return VerifyKey.from_pem(path.read_bytes())
    except FileNotFoundError:
        raise SpecError("--public-key", [Problem(str(path), "no such file: give the PEM public key of the release "
                                                            "signing key (written at the first promotion)")]) from None
    except ValueError as exc:
        raise SpecError("--public-key", [Problem(str(path), str(exc))]) from None


def target_specs(ws: Workspace, spec_path: Path | None, model: str | None) -> tuple[str, list[Any]]:
    """(model name, release target specs) from the job spec, else from the champion version's tags."""
    from pydantic import TypeAdapter, ValidationError

    from hybridtrain.specs.job import ReleaseTargetSpec, load_spec
    from hybridtrain.tracking.model_registry import CHAMPION, Registry

    if spec_path is not None:
        spec = load_spec(spec_path if Path(spec_path).is_absolute() else ws.root / spec_path)
        return model or spec.registry.model_name, list(spec.promotion.release_targets)
    if model is None:
        raise SpecError("serve", [Problem("--spec", "give --spec (the job spec listing the release targets) or "
                                                    "--model (its champion records them)")])
    champion = Registry(ws.tracking_uri, ws.mlflow_artifacts).by_alias(model, CHAMPION)
    raw = champion.tags.get(TARGET_SPECS_TAG) if champion else None
    if raw is None:
        raise SpecError("serve", [Problem(model, "no release targets are recorded on its champion; pass --spec")])
    try:
        return model, TypeAdapter(list[ReleaseTargetSpec]).validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise SpecError("serve", [Problem(TARGET_SPECS_TAG, f"unreadable ({exc}); pass --spec")]) from None


def pick(specs: Sequence[Any], name: str) -> Any:
    for t in specs:
        if t.name == name:
            return t
    known = ", ".join(t.name for t in specs) or "none"
    raise SpecError("serve", [Problem(name, f"not a release target of this model; its targets: {known}")])


def serving_site(ws: Workspace, target_spec: Any) -> str:
    """Where a target is served: an object-store target at its site, a directory target on-prem."""
    sites = ws.load_sites()
    if target_spec.kind == "object_store" and target_spec.site:
        return target_spec.site
    if ws.control_site:
        return ws.control_site
    return next((s.name for s in sites.sites if s.kind.value == "onprem"), sites.sites[0].name)


def open_target(ws: Workspace, target_spec: Any, key: Any) -> Any:
    from hybridtrain.governance.release import open_targets

    if target_spec.kind == "edge":
        raise SpecError("serve", [Problem(target_spec.name, "an edge target holds only the device export; run "
                                                            "versions/<model>/<version>/weights/artifacts/edge/score.py "
                                                            "on the device instead of serving it")])
    return open_targets([target_spec], root=ws.root, sites=ws.load_sites(), trusted_key=key)[0]


def build_server(ws: Workspace, target: str, *, spec_path: Path | None = None, model: str | None = None,
                 public_key: Path | None = None, poll_s: float = 2.0, cache_dir: Path | None = None) -> Any:
    """A ``ModelServer`` for ``target`` (not started: call ``start()``, which verifies and loads)."""
    from hybridtrain.governance.audit_log import AuditLog
    from hybridtrain.serving.server import ModelServer

    name, specs = target_specs(ws, spec_path, model)
    tspec = pick(specs, target)
    key = trusted_key(ws, public_key)
    site = serving_site(ws, tspec)
    return ModelServer(target=open_target(ws, tspec, key), model=name, trusted_key=key,
                       cache_dir=cache_dir or ws.state_dir / "serving-cache" / target, audit=AuditLog.in_workspace(ws.root),
                       site=site, poll_s=poll_s)


def start_canary(ws: Workspace, target: str, version: str, *, spec_path: Path | None = None, model: str | None = None,
                 public_key: Path | None = None, actor: str, **limits: Any) -> Any:
    """Put ``version`` on trial at one target: release it there (from the bundle archive, verified by the target)
    if the target lacks it, without moving ``current``; then write the canary pointer. Other targets are untouched."""
    import tempfile

    from hybridtrain.governance.audit_log import AuditLog
    from hybridtrain.governance.release import BundleArchive
    from hybridtrain.serving import canary
    from hybridtrain.stages.site_access import control_site
    from hybridtrain.storage import open_store

    name, specs = target_specs(ws, spec_path, model)
    tspec = pick(specs, target)
    key = trusted_key(ws, public_key)
    t = open_target(ws, tspec, key)
    if version not in t.versions(name):
        sites = ws.load_sites()
        control = control_site(ws, sites)
        archive = BundleArchive(open_store(control.store, ws.root, "bundles", site=control.name))
        with tempfile.TemporaryDirectory(prefix="hybridtrain-canary-") as tmp:
            t.accept(archive.get(name, version, Path(tmp) / "bundle"))
    return canary.start(t, AuditLog.in_workspace(ws.root), model=name, version=version, actor=actor, **limits)
