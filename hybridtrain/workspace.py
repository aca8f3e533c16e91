"""Workspace: the project checkout a control plane works in — its DVC data, configs and local state.

Everything hybridtrain writes on the embedded defaults lives under the workspace: datasets and
their ``.dvc`` pointers under ``data/``, and local state under ``.hybridtrain/`` (Prefect's
SQLite database, the MLflow store and artifacts, the directories standing for site stores,
per-site working copies). Settings resolve with one precedence, documented in the README:
CLI flag > environment (``HYBRIDTRAIN_*``) > job spec > default. Nothing is created until a
method that needs a directory is called.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hybridtrain.errors import Problem, SpecError
from hybridtrain.specs.sites import SitesCatalog

if TYPE_CHECKING:
    from hybridtrain.specs.secrets import SiteSecrets

STATE_DIR = ".hybridtrain"
SECRET_BLOCK = "hybridtrain-pseudonym-key"
RELEASE_KEY_BLOCK = "hybridtrain-release-signing-key"
#: What a workspace root is, for the messages that refuse anything else.
ROOT_FIX = "give the workspace root, the folder holding deployments/sites.yaml"


class Settings(BaseSettings):
    """Environment-level settings (``HYBRIDTRAIN_<NAME>``); CLI flags override them."""

    model_config = SettingsConfigDict(env_prefix="HYBRIDTRAIN_", extra="ignore")

    home: Path | None = Field(None, description="Workspace root; default: the current directory.")
    sites_file: Path | None = Field(None, description="Sites catalog; default deployments/sites.yaml.")
    policy_file: Path | None = Field(None, description="Placement policy; default deployments/policy.yaml.")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; default a SQLite store in .hybridtrain/mlflow."
    )
    experiment: str = Field("hybridtrain", description="MLflow experiment for lifecycle runs.")
    pseudonym_key_block: str = Field(SECRET_BLOCK, description="Prefect Secret block holding the pseudonym key.")
    release_key_block: str = Field(
        RELEASE_KEY_BLOCK, description="Prefect Secret block holding the Ed25519 key that signs model bundles."
    )
    control_site: str | None = Field(
        None, description="Site hosting Prefect and MLflow; default the first on-prem site."
    )


@dataclass(frozen=True)
class Workspace:
    """Paths of one workspace. Construct with ``Workspace.resolve`` to apply settings precedence."""

    root: Path
    sites_file: Path
    policy_file: Path
    tracking_uri: str
    experiment: str = "hybridtrain"
    pseudonym_key_block: str = SECRET_BLOCK
    release_key_block: str = RELEASE_KEY_BLOCK
    control_site: str | None = None
    #: Site credentials in memory (from Prefect blocks); never printed, compared or hashed.
    secrets: SiteSecrets | None = field(default=None, repr=False, compare=False, hash=False)

    #: Who or what acts in this process, as the audit log records it (e.g. the Prefect flow run).
    actor: str = "hybridtrain"

    def with_secrets(self, secrets: SiteSecrets | None) -> Workspace:
        return replace(self, secrets=secrets)

    def load_sites(self) -> SitesCatalog:
        """The sites catalog of the workspace, with the credentials it carries in memory merged in."""
        catalog = SitesCatalog.load(self.sites_file)
        return self.secrets.apply(catalog) if self.secrets is not None else catalog

    def with_actor(self, actor: str) -> Workspace:
        return replace(self, actor=actor)

    @classmethod
    def resolve(
        cls,
        root: Path | str | None = None,
        *,
        sites_file: Path | str | None = None,
        policy_file: Path | str | None = None,
        tracking_uri: str | None = None,
        settings: Settings | None = None,
    ) -> Workspace:
        """Explicit arguments (CLI flags) win over ``HYBRIDTRAIN_*`` settings, which win over defaults."""
        s = settings or Settings()
        base = Path(root or s.home or Path.cwd()).resolve()

        def under(p: Path | str | None, default: str) -> Path:
            path = Path(p) if p is not None else base / default
            return path if path.is_absolute() else (base / path)

        state = base / STATE_DIR
        uri = tracking_uri or s.mlflow_tracking_uri or f"sqlite:///{state / 'mlflow' / 'mlflow.db'}"
        return cls(
            root=base,
            sites_file=under(sites_file or s.sites_file, "deployments/sites.yaml"),
            policy_file=under(policy_file or s.policy_file, "deployments/policy.yaml"),
            tracking_uri=uri,
            experiment=s.experiment,
            pseudonym_key_block=s.pseudonym_key_block,
            release_key_block=s.release_key_block,
            control_site=s.control_site,
        )

    @classmethod
    def checked(cls, root: Path | str | None, *, name: str, unset_fix: str, fix: str = ROOT_FIX,
                env_fix: str = ROOT_FIX) -> Workspace:
        """The workspace at ``root`` (None or empty: ``HYBRIDTRAIN_HOME``, else the current directory) if it is an
        existing directory with a sites catalog; creates nothing.

        Otherwise a ``SpecError`` whose one problem is located at the setting that chose the root and says what
        is wrong and what to do: ``name`` (what the caller calls ``root``: the CLI's ``--home``, a flow's
        ``workspace`` parameter) with ``fix``; ``HYBRIDTRAIN_HOME`` with ``env_fix``; ``name`` with ``unset_fix``
        when neither is set and the current directory is not a workspace; ``HYBRIDTRAIN_SITES_FILE`` when that
        names no file.
        """
        given = root if root is not None and str(root) != "" else None
        ws = cls.resolve(given)
        env_home = os.environ.get("HYBRIDTRAIN_HOME")
        setting, shown, then = ((name, given, fix) if given is not None else
                                ("HYBRIDTRAIN_HOME", env_home, env_fix) if env_home else (name, None, unset_fix))

        def refuse(where: str, message: str) -> SpecError:
            return SpecError(where, [Problem(where, message)])

        if not ws.root.exists():
            raise refuse(setting, f"{shown} does not exist ({ws.root}); {then}")
        if not ws.root.is_dir():
            raise refuse(setting, f"{shown} is a file, not a directory; {then}")
        if not ws.sites_file.is_file():
            if os.environ.get("HYBRIDTRAIN_SITES_FILE"):
                raise refuse("HYBRIDTRAIN_SITES_FILE", f"no sites catalog at {ws.sites_file}; point it at one "
                                                       "(e.g. deployments/sites.yaml)")
            if shown is None:
                raise refuse(setting, f"the current directory {ws.root} is not a workspace (no "
                                      f"deployments/sites.yaml); {then}")
            raise refuse(setting, f"{shown} is not a workspace (no file {ws.sites_file}); {then}")
        return ws

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def mlflow_artifacts(self) -> Path:
        return self.state_dir / "mlflow" / "artifacts"

    @property
    def release_public_key(self) -> Path:
        """The public half of the release signing key: what release targets and the CLI trust."""
        return self.state_dir / "keys" / "release.pub.pem"

    @property
    def prefect_home(self) -> Path:
        return self.state_dir / "prefect"

    def site_workdir(self, site: str) -> Path:
        """A site's working copy (its own DVC cache and checkouts), as a host at that site would have."""
        return self.state_dir / "sites" / site

    def tier_path(self, tier: str, job: str) -> str:
        """Workspace-relative path of a job's dataset at a tier (curated, approved)."""
        return f"data/{tier}/{job}"

    def path(self, relative: str) -> Path:
        return self.root / relative

    def prefect_env(self) -> dict[str, str]:
        """Environment that points Prefect at this workspace's embedded server database.

        Used only when the user has not configured Prefect (no ``PREFECT_API_URL`` and no
        ``PREFECT_HOME``): then runs are stored in ``.hybridtrain/prefect`` so ``make ui``
        shows them. A configured Prefect server always wins.
        """
        if os.environ.get("PREFECT_API_URL") or os.environ.get("PREFECT_HOME"):
            return {}
        return {
            "PREFECT_HOME": str(self.prefect_home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # The first start creates the SQLite schema; on a busy 2-core machine that takes > 20 s.
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        }
