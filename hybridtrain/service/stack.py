"""Stack: the served control plane's layout — its ports, data directories, URLs and each process's command.

One ``Stack`` is written to ``.hybridtrain/stack/stack.json`` by the first ``make up`` and read back by
every later ``up``, ``down``, ``status`` and ``hybridtrain doctor``, so the ports and the database
password stay the same and the data under ``.hybridtrain/stack/`` survives ``make down && make up``.
Nothing here starts a process: ``scripts/stack.py`` does, from these values.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hybridtrain.errors import Problem, SpecError

STACK_DIR = ".hybridtrain/stack"
#: The stack's PostgreSQL databases: Prefect's, MLflow's, and the sweeps' Optuna studies.
SWEEP_DATABASE = "optuna"
DATABASES = ("prefect", "mlflow", SWEEP_DATABASE)
PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin",)
POOLS = ("onprem", "cloud")
CONTROL_POOL = "control"
#: What each pool's warm spares import ahead: a site pool's runs are mostly lifecycles (flows.lifecycle
#: pulls in torch and scikit-learn through the federated flow: ~5 s of a run's start on a quiet core),
#: the control pool's the burst controller and the recovery.
SITE_PRELOAD = "flows.lifecycle,flows.training,flows.data"
CONTROL_PRELOAD = "flows.burst,flows.recovery"


class Stack(BaseModel):
    """Where each part of the served stack listens and keeps its data (all on loopback)."""

    model_config = ConfigDict(extra="forbid")

    root: Path = Field(description="Workspace root; the stack's state lives in <root>/.hybridtrain/stack.")
    host: str = Field("127.0.0.1", description="Address every server binds; loopback only.")
    prefect_port: int = Field(description="Prefect API + UI port.")
    mlflow_port: int = Field(description="MLflow tracking server port.")
    postgres_port: int = Field(description="PostgreSQL port (Prefect's, MLflow's and the sweeps' databases).")
    s3_port: int = Field(description="S3-compatible store (moto server mode) standing in for S3.")
    redis_port: int | None = Field(
        None, description="Redis port: Prefect's event messaging, concurrency leases and background-task queue "
                          "between its API and its services process. None (a stack saved before Redis): the next "
                          "`up` picks a free one.")
    redis_password: str = Field(default_factory=lambda: secrets.token_urlsafe(18),
                                description="Redis's password (in stack.json and redis.conf, both mode 0600).")
    api_workers: int = Field(
        2, ge=1, description="Processes serving Prefect's API (`prefect server start --workers`): two use both cores "
                             "of a small host (40 runs at once on 2 cores: API p50 109 ms, p99 764 ms, against "
                             "151 / 913 ms with one). The background services (scheduler, late runs, event "
                             "persister, triggers, ...) run in a process of their own either way, so a busy service "
                             "never holds an API call.")
    db_user: str = Field("hybridtrain", description="PostgreSQL role owning the databases.")
    db_password: str = Field(description="That role's password (also in stack.json, mode 0600).")
    bucket: str = Field("hybridtrain-mlflow", description="Bucket holding MLflow's artifacts.")
    pools: tuple[str, ...] = Field(POOLS, description="Work pools that get workers.")
    workers_per_pool: int = Field(2, ge=1, description="Process workers started per pool.")
    control_pool: str = Field(
        CONTROL_POOL, description="Pool of the control flows (burst-controller, recover-runs): no run limit, its "
                                  "own worker, so a full site pool never delays the flows that supervise it.")
    control_workers: int = Field(1, ge=1, description="Process workers started for the control pool.")
    worker_query_seconds: float = Field(1.0, gt=0, description="How often the control pool's worker polls for due runs.")
    site_query_seconds: float = Field(
        1.0, gt=0, description="How often the site pools' workers poll. Each poll is one of the API's dearest calls "
        "(get_scheduled_flow_runs, the top endpoint in a profile under load), but polling every 3 s instead of 1 "
        "did not lower the API's p99 under 40 runs at once (821 ms against 764 and 899 ms), so it stays 1.")
    train_lease_s: float = Field(
        300.0, ge=60, description="Training lease of the workers' runs (HYBRIDTRAIN_TRAIN_LEASE_S): Prefect renews "
        "it every 3/4 of this, so a 60 s lease is lost by a run its host starves for a minute (seen at load 25 on 2 "
        "cores: the run crashed). The price: a run resubmitted after its holder died waits up to this long to "
        "train, as long as recover-runs' 300 s heartbeat timeout.")
    worker_prefetch_seconds: float = Field(
        10.0, ge=0, description="How long before its scheduled time a worker may start a run.")
    warm_spares: int = Field(
        2, ge=0, description="Pre-imported spare processes per pool (workers.warm_pool) that start runs; 0: cold.")
    site_nice: int = Field(
        10, ge=0, le=19, description="CPU niceness of the site pools' workers and warm spares, inherited by the runs "
        "they start: on a host shared with the control plane (Prefect API and scheduler, PostgreSQL, MLflow, the "
        "control pool), training yields the CPU to it instead of starving it. 0: equal shares.")
    site_cpus: list[int] | None = Field(
        None, description="CPUs the site pools' workers and warm spares may run on, inherited by the runs they start "
        "(None: all). On a host shared with the control plane, leaving it a core of its own keeps training off the "
        "CPU the Prefect API and PostgreSQL answer on, as separate hosts would.")
    pg_bin: str = Field(description="Directory of the PostgreSQL server binaries (initdb, pg_ctl).")
    pg_os_user: str | None = Field(
        None, description="OS user that runs PostgreSQL when started as root (it refuses to run as root).")

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def file(cls, root: Path) -> Path:
        return Path(root).resolve() / STACK_DIR / "stack.json"

    @classmethod
    def load(cls, root: Path) -> Stack | None:
        """The stack written by an earlier ``up`` of this workspace, if any."""
        path = cls.file(root)
        if not path.is_file():
            return None
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as exc:
            raise SpecError(str(path), [Problem("", f"unreadable stack settings ({exc.__class__.__name__}); "
                                                    "fix or delete the file and run `make up` again")]) from exc

    @classmethod
    def create(cls, root: Path, ports: dict[str, int], *, is_root: bool, **overrides: object) -> Stack:
        """A new stack for ``root`` on ``ports`` (prefect, mlflow, postgres, s3, and redis if given)."""
        pg_bin = overrides.pop("pg_bin", None) or find_pg_bin()
        return cls(root=Path(root).resolve(), prefect_port=ports["prefect"], mlflow_port=ports["mlflow"],
                   postgres_port=ports["postgres"], s3_port=ports["s3"], redis_port=ports.get("redis"),
                   db_password=secrets.token_urlsafe(18),
                   pg_bin=str(pg_bin), pg_os_user="postgres" if is_root else None, **overrides)

    def save(self) -> Path:
        path = self.file(self.root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    # -- places -----------------------------------------------------------------------------

    @property
    def state(self) -> Path:
        return self.root / STACK_DIR

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def run_dir(self) -> Path:
        """Pid files of the processes ``up`` started."""
        return self.state / "run"

    @property
    def pg_dir(self) -> Path:
        """PostgreSQL's own directory (owned by its OS user): the cluster in ``data/``, its log."""
        return self.state / "postgres"

    @property
    def pg_data(self) -> Path:
        return self.pg_dir / "data"

    @property
    def redis_dir(self) -> Path:
        """Redis's config (with its password, mode 0600) and append-only file: queued events and leases
        survive ``make down && make up``."""
        return self.state / "redis"

    @property
    def s3_snapshot(self) -> Path:
        """The bucket's objects, saved by ``down`` and put back by ``up`` (moto keeps them in memory only)."""
        return self.state / "s3"

    @property
    def prefect_home(self) -> Path:
        return self.state / "prefect"

    def server_log(self) -> Path:
        return self.logs / "prefect-server.log"

    def services_process_log(self) -> Path:
        """Output of the services process (``prefect-background``); each service's runs go to ``services_log``."""
        return self.logs / "prefect-background.log"

    def services_log(self) -> Path:
        """Every run of the server's background services, success or failure (``hybridtrain doctor`` reads it)."""
        return self.logs / "prefect-services.log"

    # -- URLs -------------------------------------------------------------------------------

    @property
    def prefect_api(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def s3_url(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def redis_url(self) -> str:
        if self.redis_port is None:
            raise SpecError(str(self.file(self.root)), [Problem("redis_port", "no Redis port yet; run `make up`")])
        return f"redis://default:{self.redis_password}@{self.host}:{self.redis_port}/0"

    def redis_conf(self) -> str:
        """redis.conf: loopback only, a password, the append-only file in ``redis_dir``, no RDB snapshots."""
        return "\n".join([f"bind {self.host}", f"port {self.redis_port}", "protected-mode yes",
                          f"requirepass {self.redis_password}", f'dir "{self.redis_dir}"', "appendonly yes",
                          "appendfsync everysec", 'save ""', "daemonize no", ""])

    def db_url(self, database: str, driver: str = "") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{self.db_user}:{self.db_password}@{self.host}:{self.postgres_port}/{database}"

    @property
    def sweep_storage(self) -> str:
        """The sweeps' Optuna studies: database ``optuna`` of the stack's PostgreSQL."""
        return self.db_url(SWEEP_DATABASE)

    # -- environments -----------------------------------------------------------------------

    def s3_env(self) -> dict[str, str]:
        """Credentials for the S3 stand-in (moto accepts any; dummies keep real AWS ones out)."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "MLFLOW_S3_ENDPOINT_URL": self.s3_url}

    def prefect_server_env(self) -> dict[str, str]:
        return {"PREFECT_HOME": str(self.prefect_home),
                "PREFECT_API_DATABASE_CONNECTION_URL": self.db_url("prefect", "asyncpg"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                # Defaults (5 s to connect, 10 s per statement, 5+10 pooled connections) turn a busy
                # host's slow PostgreSQL logins into HTTP 500s (TimeoutError in connect); keep more
                # connections open and wait longer for a new one.
                "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
                "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
                "PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE": "20",
                "PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW": "20",
                "PREFECT_LOGGING_SETTINGS_PATH": str(self.state / "prefect-logging.yml"),
                "PREFECT_UI_API_URL": self.prefect_api,
                # The API and the services are separate processes (and the API may be several): events,
                # concurrency leases and docket's task queue go through Redis, as Prefect's guide for
                # scaling a self-hosted server does it (prefect-redis).
                "PREFECT_SERVER_EVENTS_MESSAGING_BROKER": "prefect_redis.messaging",
                "PREFECT_SERVER_EVENTS_MESSAGING_CACHE": "prefect_redis.messaging",
                "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "prefect_redis.ordering",
                "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect_redis.lease_storage",
                "PREFECT_SERVER_DOCKET_URL": self.redis_url,
                "PREFECT_REDIS_MESSAGING_URL": self.redis_url}

    def client_env(self) -> dict[str, str]:
        """What a process talking to this stack needs: the Prefect API, MLflow, the sweeps' study database, the workspace."""
        return {"PREFECT_API_URL": self.prefect_api, "HYBRIDTRAIN_HOME": str(self.root),
                "HYBRIDTRAIN_MLFLOW_TRACKING_URI": self.mlflow_url, "MLFLOW_TRACKING_URI": self.mlflow_url,
                "HYBRIDTRAIN_SWEEP_STORAGE": self.sweep_storage,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
                "DVC_NO_ANALYTICS": "1", "PREFECT_LOGGING_EXTRA_LOGGERS": "hybridtrain"}

    def warm_socket(self, pool: str) -> Path:
        """The pool's warm-pool daemon socket (under /tmp when the state path is too long for a socket)."""
        path = self.state / "warm" / f"{pool}.sock"  # its directory must be 0700 (workers.warm_pool checks)
        if len(str(path)) > 100:
            digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
            path = Path(tempfile.gettempdir()) / f"hybridtrain-warm-{digest}" / f"{pool}.sock"
        return path

    def worker_env(self, pool: str) -> dict[str, str]:
        env = {**self.client_env(), **self.s3_env(),
               "PREFECT_WORKER_QUERY_SECONDS": f"{self.query_seconds_of(pool):g}",
               "PREFECT_WORKER_PREFETCH_SECONDS": f"{self.worker_prefetch_seconds:g}",
               "HYBRIDTRAIN_TRAIN_LEASE_S": f"{self.train_lease_s:g}"}
        if self.warm_spares:
            env["HYBRIDTRAIN_WARM_SOCKET"] = str(self.warm_socket(pool))
        return env

    # -- commands ---------------------------------------------------------------------------

    def prefect_server_cmd(self) -> list[str]:
        """The API (and UI) only: the services run in ``prefect_services_cmd``."""
        return [sys.executable, "-m", "prefect", "server", "start", "--host", self.host,
                "--port", str(self.prefect_port), "--no-services", "--workers", str(self.api_workers)]

    def prefect_services_cmd(self) -> list[str]:
        """Prefect's background services (scheduler, late runs, foreman, event persister, triggers, ...)."""
        return [sys.executable, "-m", "prefect", "server", "services", "start"]

    def redis_cmd(self) -> list[str]:
        return [str(find_redis_server()), str(self.redis_dir / "redis.conf")]

    def mlflow_cmd(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "server", "--host", self.host, "--port", str(self.mlflow_port),
                "--backend-store-uri", self.db_url("mlflow"),
                "--artifacts-destination", f"s3://{self.bucket}/mlflow",
                # One uvicorn process: with more, uvicorn's supervisor kills a worker that misses its
                # 5 s health ping while starting on a busy host, and restarts it in a loop.
                "--workers", "1"]

    def s3_cmd(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.s3_port)]

    @property
    def worker_pools(self) -> tuple[str, ...]:
        """Every pool that gets workers: the sites' pools, then the control pool."""
        return (*self.pools, self.control_pool)

    def workers_of(self, pool: str) -> int:
        return self.control_workers if pool == self.control_pool else self.workers_per_pool

    def query_seconds_of(self, pool: str) -> float:
        """How often ``pool``'s workers poll the API for due runs."""
        return self.worker_query_seconds if pool == self.control_pool else self.site_query_seconds

    def nice_of(self, pool: str) -> int:
        """The niceness ``up`` starts ``pool``'s worker and warm-pool processes with (the control pool: 0)."""
        return 0 if pool == self.control_pool else self.site_nice

    def cpus_of(self, pool: str) -> list[int] | None:
        """The CPUs ``up`` pins ``pool``'s worker and warm-pool processes to (None: all; the control pool: all)."""
        return None if pool == self.control_pool else self.site_cpus

    def warm_cmds(self) -> dict[str, list[str]]:
        """Name -> command of each pool's warm-pool daemon (none when ``warm_spares`` is 0)."""
        if not self.warm_spares:
            return {}
        return {f"warm-{pool}": [sys.executable, "-m", "workers.warm_pool", "--spares", str(self.warm_spares),
                                 "--preload", CONTROL_PRELOAD if pool == self.control_pool else SITE_PRELOAD]
                for pool in self.worker_pools}

    def worker_cmds(self, pool_limits: Mapping[str, int | None] | None = None) -> dict[str, list[str]]:
        """Name -> command of each process worker (``onprem-1``, ``onprem-2``, ``cloud-1`` ..., ``control-1``).

        With ``pool_limits`` (pool -> its run limit on the server), each worker of a limited pool gets
        ``--limit``, its share of the pool's limit (``split_limit``), so the pool's runs can never
        exceed it: the server's own cap counts free slots per poll, and under load two workers polling
        each second both took the same slots before either's runs were PENDING (13 running at a limit
        of 8). A pool with fewer slots than workers gets one worker per slot. Without limits: every name.
        """
        cmds = {}
        for pool in self.worker_pools:
            shares = split_limit((pool_limits or {}).get(pool), self.workers_of(pool))
            for i, share in enumerate(shares, start=1):
                cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
                       "--name", f"{pool}-{i}"]
                cmds[f"worker-{pool}-{i}"] = cmd if share is None else [*cmd, "--limit", str(share)]
        return cmds


def split_limit(limit: int | None, workers: int) -> list[int | None]:
    """Each worker's share of a pool's run limit: the shares sum to the limit, differ by at most one,
    and none is zero (a pool with fewer slots than workers gets fewer workers). ``None``: no limit."""
    if limit is None:
        return [None] * workers
    return [share for i in range(workers) if (share := limit // workers + (i < limit % workers)) > 0]


def find_pg_bin() -> Path:
    """The PostgreSQL server binaries: Debian's ``postgresql-15``, else ``initdb`` on PATH."""
    for cand in PG_BIN_CANDIDATES:
        if (Path(cand) / "initdb").is_file():
            return Path(cand)
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise SpecError("PostgreSQL", [Problem("initdb", "PostgreSQL server binaries not found; install them with "
                                                     "`scripts/setup-system.sh` (Debian postgresql-15)")])


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (ended, not yet reaped by a parent that is gone or by a PID 1 that does
    not reap, as in many containers) does not."""
    try:
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:  # the state is the field after the command name, which may hold spaces and parentheses
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc here: kill(0) is all we know


def find_redis_server() -> Path:
    """Debian's ``redis-server`` (or one on PATH)."""
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").is_file()
                                             else None)
    if found is None:
        raise SpecError("Redis", [Problem("redis-server", "Redis server not found; install it with "
                                                          "`scripts/setup-system.sh` (Debian redis-server)")])
    return Path(found)


def logging_config(services_log: Path) -> str:
    """Prefect's server logging config plus a file that records every background-service run.

    Prefect 3.8 runs its services (scheduler, late runs, foreman, ...) as docket perpetual tasks;
    docket logs each run at INFO (``↫``) and each failure at ERROR (``↩`` and the traceback) on the
    ``docket`` loggers, which Prefect's default config drops below WARNING. Keeping them in their
    own rotating file lets ``hybridtrain doctor`` tell a service failing now from one that failed once.
    """
    from importlib.resources import files

    import yaml

    base = yaml.safe_load(files("prefect.logging").joinpath("logging.yml").read_text())
    base["handlers"]["services_file"] = {"class": "logging.handlers.RotatingFileHandler", "level": "INFO",
                                         "formatter": "standard", "filename": str(services_log),
                                         "maxBytes": 5_000_000, "backupCount": 1}
    base["handlers"]["console_warnings"] = {**base["handlers"]["console"], "level": "WARNING"}
    for name in ("docket", "prefect.server.services", "prefect.server.events.services"):
        base["loggers"][name] = {"level": "INFO", "handlers": ["services_file", "console_warnings"],
                                 "propagate": False}
    return yaml.safe_dump(base, sort_keys=False)
