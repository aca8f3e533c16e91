"""JobBundle: everything a host needs to run one training job — spec, data pointer, site, run key — as files.

The control plane writes a bundle into a directory, ships the directory to the host (SFTP)
and starts ``python -m hybridtrain.remote.host_training <dir>`` there. Nothing in it is data: the
approved dataset travels as its DVC pointer and is fetched from the site's own store, and the
checkpoints of ``run_key`` live in that store too, so a job restarted anywhere on the site
resumes where the last one stopped. Layout::

    bundle.json    the JobBundle, secrets blanked (safe to print and log)
    secrets.json   the blanked values by field path (mode 0600; e.g. the store's secret key)

``read`` puts the secrets back; neither file holds anything else.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from hybridtrain.datasets.dvc_repo import DatasetVersion
from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.job import JobSpec, parse_spec
from hybridtrain.specs.sites import Site

BUNDLE_FILE = "bundle.json"
SECRETS_FILE = "secrets.json"
JOB_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


HOST_EXCLUDES = {"site": {"instances"}}


class JobBundle(BaseModel):
    """One training job as shipped to a host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    job_id: str = Field(pattern=JOB_ID_RE, description="Names the job on the host (its directory, re-attach).")
    code_version: str = Field(description="Git commit of the control plane that built the bundle.")
    spec: dict[str, Any] = Field(description="The JobSpec in its YAML form (JobSpec.to_dict()).")
    approved: DatasetVersion = Field(description="Pointer to the approved dataset in the site's store.")
    site: Site = Field(description="The site the host belongs to; its store holds data and checkpoints.")
    workdir: str = Field(description="Absolute working directory on the host; the data copy lives under it.")
    run_key: str = Field(min_length=1, description="Checkpoint series: the same key resumes, a new one starts fresh.")
    mlflow_run_id: str | None = Field(None, description="The lifecycle's MLflow run (for reference in logs).")

    def job_spec(self) -> JobSpec:
        """The spec, validated again on the host (the bundle may come from another version)."""
        return parse_spec(self.spec, source=f"job bundle {self.job_id} (spec)")

    def write(self, directory: Path | str) -> Path:
        """Write ``bundle.json`` and ``secrets.json`` (mode 0600) into ``directory``; returns it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # How a cloud site starts instances is the control plane's business, never the host's (and a host
        # image older than the ``instances`` field still reads the bundle).
        public = self.model_dump(mode="json", exclude=HOST_EXCLUDES)
        secrets: dict[str, str] = {}
        _blank_secrets(self.model_dump(mode="python", exclude=HOST_EXCLUDES), public, "", secrets)
        _write_atomic(directory / SECRETS_FILE, json.dumps(secrets, sort_keys=True).encode(), 0o600)
        _write_atomic(directory / BUNDLE_FILE, json.dumps(public, indent=1, sort_keys=True).encode(), 0o644)
        return directory

    @classmethod
    def read(cls, directory: Path | str) -> JobBundle:
        """Read a bundle written by ``write``; a missing or malformed file is a ``SpecError``."""
        directory = Path(directory)
        path = directory / BUNDLE_FILE
        try:
            data = json.loads(path.read_text())
            secrets_path = directory / SECRETS_FILE
            secrets = json.loads(secrets_path.read_text()) if secrets_path.exists() else {}
        except (OSError, ValueError) as exc:
            raise SpecError(str(path), [Problem(BUNDLE_FILE, f"cannot read the job bundle: {exc}")]) from None
        for dotted, value in secrets.items():
            _put(data, dotted.split("."), value)
        try:
            return cls.model_validate(data)
        except ValueError as exc:
            raise SpecError(str(path), [Problem(BUNDLE_FILE, f"not a valid job bundle: {exc}")]) from None


def _blank_secrets(raw: Any, public: Any, path: str, out: dict[str, str]) -> None:
    """Move every SecretStr value of ``raw`` into ``out`` (by dotted path) and blank it in ``public``."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            sub = f"{path}.{key}" if path else str(key)
            if isinstance(value, SecretStr):
                out[sub] = value.get_secret_value()
                public[key] = None
            else:
                _blank_secrets(value, public[key], sub, out)
    elif isinstance(raw, (list, tuple)):
        for i, value in enumerate(raw):
            if isinstance(value, SecretStr):
                raise TypeError(f"secret inside a list at {path}[{i}] is not supported")
            _blank_secrets(value, public[i], f"{path}.{i}", out)


def _put(data: Any, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data[int(key)] if isinstance(data, list) else data[key]
    data[keys[-1]] = value


def _write_atomic(path: Path, blob: bytes, mode: int) -> None:
    # Created with its final mode from the start, so a secret is never readable by others.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
