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
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridtrain.errors import Problem, SpecError
from hybridtrain.workspace import Workspace

TARGET_SPECS_TAG = "hybridtrain.release.target_specs"
MIN_POLL_S = 0.05  # polling the pointers more often only burns CPU re-reading them
MAX_POLL_S = 3600.0  # polling less often, a release or rollback would wait more than an hour to be served


def trusted_key(ws: Workspace, public_key: Path | None, *, command: str = "serve") -> Any:
    """The release public key the server trusts: ``public_key`` or the workspace's copy."""
    from hybridtrain.governance.signing_key import VerifyKey

    path = Path(public_key) if public_key else ws.release_public_key
    give = "give the PEM public key of the release signing key (written at the first promotion)"
    try:
        return VerifyKey.from_pem(path.read_bytes())
    except FileNotFoundError:
        raise SpecError(command, [Problem("--public-key", f"{path}: no such file; {give}")]) from None
    except IsADirectoryError:
        raise SpecError(command, [Problem("--public-key", f"{path} is a directory; {give}")]) from None
    except OSError as exc:
        raise SpecError(command, [Problem("--public-key", f"{path}: cannot read it ({exc.strerror}); {give}")]) from None
    except ValueError as exc:
        raise SpecError(command, [Problem("--public-key", f"{path}: {exc}; {give}")]) from None


def check_model_name(model: str, *, command: str = "serve") -> None:
    """Refuse a ``--model`` that cannot be a model name (it becomes part of paths on the targets)."""
    from hybridtrain.specs.job import MODEL_NAME_RE

    if not re.match(MODEL_NAME_RE, model):
        raise SpecError(command, [Problem("--model", f"{model!r} is not a model name: letters, digits and . _ - "
                                                     "only, starting with a letter or digit (e.g. churn-classifier)")])


def target_specs(ws: Workspace, spec_path: Path | None, model: str | None, *,
                 command: str = "serve") -> tuple[str, list[Any]]:
    """(model name, release target specs) from the job spec, else from the champion version's tags."""
    from pydantic import TypeAdapter, ValidationError

    from hybridtrain.specs.job import ReleaseTargetSpec, load_spec
    from hybridtrain.tracking.model_registry import CHAMPION, Registry

    if model is not None:
        check_model_name(model, command=command)
    if spec_path is not None:
        spec = load_spec(spec_path if Path(spec_path).is_absolute() else ws.root / spec_path)
        return model or spec.registry.model_name, list(spec.promotion.release_targets)
    if model is None:
        raise SpecError(command, [Problem("--spec", "give --spec (the job spec listing the release targets) or "
                                                    "--model (its champion records them)")])
    registry = Registry(ws.tracking_uri, ws.mlflow_artifacts)
    champion = registry.by_alias(model, CHAMPION)
    if champion is None:
        raise SpecError(command, [_no_champion(registry, model)])
    raw = champion.tags.get(TARGET_SPECS_TAG)
    if raw is None:
        raise SpecError(command, [Problem("--model", f"no release targets are recorded on {model}'s champion "
                                                     f"(v{champion.version}); pass --spec")])
    try:
        return model, TypeAdapter(list[ReleaseTargetSpec]).validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise SpecError(command, [Problem(TARGET_SPECS_TAG, f"unreadable ({exc}); pass --spec")]) from None


def _no_champion(registry: Any, model: str) -> Problem:
    """Why ``model`` has no champion: it is not registered (say which are), or nothing was promoted yet."""
    from mlflow.exceptions import MlflowException

    try:
        registry.client.get_registered_model(model)
    except MlflowException:
        names = sorted(m.name for m in registry.client.search_registered_models(max_results=100))
        known = ", ".join(names) if names else "none yet (train and promote one first)"
        return Problem("--model", f"no model {model!r} is registered; registered models: {known}")
    return Problem("--model", f"{model} has no champion yet, so no release targets are recorded for it; promote "
                              "a version first, or pass --spec")


def pick(specs: Sequence[Any], name: str, *, command: str = "serve") -> Any:
    for t in specs:
        if t.name == name:
            return t
    known = ", ".join(t.name for t in specs) or "none"
    raise SpecError(command, [Problem(name, f"not a release target of this model; its targets: {known}")])


def serving_site(ws: Workspace, target_spec: Any) -> str:
    """Where a target is served: an object-store target at its site, a directory target on-prem."""
    sites = ws.load_sites()
    if target_spec.kind == "object_store" and target_spec.site:
        return target_spec.site
    if ws.control_site:
        return ws.control_site
    return next((s.name for s in sites.sites if s.kind.value == "onprem"), sites.sites[0].name)


def open_target(ws: Workspace, target_spec: Any, key: Any, *, command: str = "serve") -> Any:
    from hybridtrain.governance.release import open_targets

    if target_spec.kind == "edge":
        raise SpecError(command, [Problem(target_spec.name, "an edge target holds only the device export; run "
                                                            "versions/<model>/<version>/weights/artifacts/edge/score.py "
                                                            "on the device instead of serving it")])
    target = open_targets([target_spec], root=ws.root, sites=ws.load_sites(), trusted_key=key)[0]
    root = getattr(target, "root", None)  # a directory target's serving directory
    blocker = _not_a_directory(root) if root is not None else None
    if blocker is not None:
        there = "is a file" if blocker == root else f"cannot be one: {blocker} is a file"
        raise SpecError(command, [Problem(target_spec.name, f"the target's path {root} {there}, not a directory; "
                                                            "point its path (promotion.release_targets) at the "
                                                            "serving directory, or move the file away")])
    return target


def _not_a_directory(path: Path) -> Path | None:
    """The first existing path on the way to ``path`` (itself included) that is not a directory, else None."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def build_server(ws: Workspace, target: str, *, spec_path: Path | None = None, model: str | None = None,
                 public_key: Path | None = None, poll_s: float = 2.0, cache_dir: Path | None = None) -> Any:
    """A ``ModelServer`` for ``target`` (not started: call ``start()``, which verifies and loads)."""
    from hybridtrain.governance.audit_key import workspace_log
    from hybridtrain.serving.server import ModelServer

    if not (isinstance(poll_s, (int, float)) and math.isfinite(poll_s) and MIN_POLL_S <= poll_s <= MAX_POLL_S):
        raise SpecError("serve", [Problem("poll_s", f"{poll_s!r} is not a polling interval; give the seconds between "
                                                    f"checks of the target's pointers, a number from {MIN_POLL_S} to "
                                                    f"{MAX_POLL_S:.0f} (e.g. 2)")])
    name, specs = target_specs(ws, spec_path, model)
    tspec = pick(specs, target)
    key = trusted_key(ws, public_key)
    site = serving_site(ws, tspec)
    return ModelServer(target=open_target(ws, tspec, key), model=name, trusted_key=key,
                       cache_dir=cache_dir or ws.state_dir / "serving-cache" / target, audit=workspace_log(ws.root),
                       site=site, poll_s=poll_s)


def check_version(version: str, *, command: str = "canary") -> None:
    """Refuse a VERSION argument that is not a version (it becomes part of paths on the targets)."""
    from hybridtrain.governance.release import VERSION_RE

    if not VERSION_RE.match(version):
        raise SpecError(command, [Problem("VERSION", f"{version!r} is not a version: give a registered version of "
                                                     "the model, e.g. 3 (letters, digits and . _ - only, no spaces)")])


def start_canary(ws: Workspace, target: str, version: str, *, spec_path: Path | None = None, model: str | None = None,
                 public_key: Path | None = None, actor: str, **limits: Any) -> Any:
    """Put ``version`` on trial at one target: release it there (from the bundle archive, verified by the target)
    if the target lacks it, without moving ``current``; then write the canary pointer. Other targets are untouched.

    Everything that can be checked is checked before anything is written: the limits, the version, the target
    and its key, and that the target serves another version to compare the canary with."""
    import tempfile

    from hybridtrain.governance.audit_key import workspace_log
    from hybridtrain.governance.release import BundleArchive
    from hybridtrain.serving import canary
    from hybridtrain.stages.site_access import control_site
    from hybridtrain.storage import open_store

    canary.new_plan("-", version, **limits)  # every limit, before anything is released
    check_version(version)
    name, specs = target_specs(ws, spec_path, model, command="canary")
    tspec = pick(specs, target, command="canary")
    key = trusted_key(ws, public_key, command="canary")
    t = open_target(ws, tspec, key, command="canary")
    canary.check_target(t, name, version)
    if version not in t.versions(name):
        sites = ws.load_sites()
        control = control_site(ws, sites)
        archive = BundleArchive(open_store(control.store, ws.root, "bundles", site=control.name))
        with tempfile.TemporaryDirectory(prefix="hybridtrain-canary-") as tmp:
            t.accept(archive.get(name, version, Path(tmp) / "bundle"))
    return canary.start(t, workspace_log(ws.root), model=name, version=version, actor=actor, **limits)
