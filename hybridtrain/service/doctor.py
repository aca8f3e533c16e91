"""Doctor: checks a served stack part by part and names each one that is down or failing, and why.

Checks, in order: PostgreSQL accepts logins; Redis answers; the S3 store answers and has the artifact
bucket; MLflow's ``/health``; Prefect's ``/api/health`` (the API is up) and ``/api/ready`` (its
database is reachable); the services process is alive, and each Prefect server service's last report
(``server_log``) — the API stays healthy while, say, the scheduler fails on every loop; and each work
pool has an online worker. Plain HTTP, a database login and a Redis ping: no Prefect import, so it
runs where nothing else of the stack is installed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hybridtrain.service.server_log import service_statuses
from hybridtrain.service.stack import DATABASES, Stack, process_alive

TIMEOUT_S = 20.0  # generous: a busy host (or a server under load) answers slowly, which is not a failure


@dataclass(frozen=True)
class Finding:
    """One checked part: ``ok`` or a problem with the reason and, where known, what to do."""

    component: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok     ' if self.ok else 'PROBLEM'} {self.component}: {self.detail}"


def _http(method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _unreachable(component: str, url: str, exc: OSError, fix: str) -> Finding:
    why = getattr(exc, "reason", None) or exc
    return Finding(component, False, f"not reachable at {url} ({why}); {fix}")


def check_prefect_api(api: str, fix: str = "start it with `make up`") -> list[Finding]:
    try:
        code, body = _http("GET", f"{api}/health")
    except OSError as exc:
        return [_unreachable("prefect api", api, exc, fix)]
    if code != 200 or body.strip() != b"true":
        return [Finding("prefect api", False, f"{api}/health answered {code} {body[:200]!r}")]
    found = [Finding("prefect api", True, f"{api} healthy")]
    code, body = _http("GET", f"{api}/ready")
    if code != 200:
        found.append(Finding("prefect database", False,
                             f"{api}/ready answered {code}: {body[:200].decode(errors='replace')}"))
    else:
        found.append(Finding("prefect database", True, "reachable from the server"))
    return found


def check_services(log: Path) -> list[Finding]:
    """One finding per Prefect server service seen in ``log`` (see ``server_log``)."""
    if not log.is_file():
        return [Finding("prefect services", False, f"no server log at {log}; was the server started by `make up`?")]
    with log.open(errors="replace") as fh:
        statuses = service_statuses(fh)
    if not statuses:
        return [Finding("prefect services", True, f"no service has reported a failure ({log})")]
    return [Finding(f"prefect service {s.service}", s.ok, s.line().split(": ", 1)[1]) for s in statuses]


def check_workers(api: str, pools: tuple[str, ...]) -> list[Finding]:
    found = []
    for pool in pools:
        try:
            code, body = _http("POST", f"{api}/work_pools/{pool}/workers/filter", {"limit": 100})
        except OSError as exc:
            found.append(_unreachable(f"pool {pool}", api, exc, "start the Prefect server"))
            continue
        if code == 404:
            found.append(Finding(f"pool {pool}", False, "no such work pool; create it with `hybridtrain deploy`"))
            continue
        if code != 200:  # e.g. the server's database is down: the API answers 500/503
            found.append(Finding(f"pool {pool}", False, f"workers not readable: {api}/work_pools/{pool}/workers/filter "
                                                        f"answered {code} {body[:200].decode(errors='replace')}"))
            continue
        online = [w["name"] for w in json.loads(body or b"[]") if w.get("status") == "ONLINE"]
        found.append(Finding(f"pool {pool}", bool(online),
                             f"{len(online)} worker(s) online: {', '.join(sorted(online))}" if online else
                             f"no online worker; start one with `prefect worker start --pool {pool}`"))
    return found


def check_mlflow(url: str) -> Finding:
    try:
        code, body = _http("GET", f"{url}/health")
    except OSError as exc:
        return _unreachable("mlflow", url, exc, "start it with `make up`")
    if code != 200:
        return Finding("mlflow", False, f"{url}/health answered {code} {body[:200]!r}")
    return Finding("mlflow", True, f"{url} healthy")


def check_s3(url: str, bucket: str) -> Finding:
    try:
        code, _ = _http("HEAD", f"{url}/{bucket}")
    except OSError as exc:
        return _unreachable("s3", url, exc, "start it with `make up`")
    if code != 200:
        return Finding("s3", False, f"bucket {bucket!r} at {url} answered {code}; `make up` creates it")
    return Finding("s3", True, f"{url} bucket {bucket}")


def check_postgres(stack: Stack) -> Finding:
    import psycopg2

    try:
        conn = psycopg2.connect(host=stack.host, port=stack.postgres_port, user=stack.db_user,
                                password=stack.db_password, dbname="prefect", connect_timeout=int(TIMEOUT_S))
    except psycopg2.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Finding("postgres", False, f"{stack.host}:{stack.postgres_port}: {first}; start it with `make up`")
    with conn, conn.cursor() as cur:
        cur.execute("SHOW server_version")
        version = cur.fetchone()[0]
        cur.execute("SELECT datname FROM pg_database")
        missing = sorted(set(DATABASES) - {row[0] for row in cur.fetchall()})
    conn.close()
    if missing:
        return Finding("postgres", False, f"{stack.host}:{stack.postgres_port} PostgreSQL {version} has no database "
                                          f"{', '.join(missing)} (the stack's: {', '.join(DATABASES)}); run `make up`, "
                                          "which creates the missing ones")
    return Finding("postgres", True, f"{stack.host}:{stack.postgres_port} PostgreSQL {version}, databases "
                                     f"{', '.join(DATABASES)}")


def check_redis(stack: Stack) -> Finding:
    import redis

    if stack.redis_port is None:
        return Finding("redis", False, "this stack has no Redis yet (saved by an older `make up`); run `make up`")
    where = f"{stack.host}:{stack.redis_port}"
    try:
        with redis.Redis.from_url(stack.redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=5) as client:
            version = client.info("server").get("redis_version", "?")
    except (redis.RedisError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Finding("redis", False, f"{where}: {first}; Prefect's events and leases stop with it; start it "
                                       "with `make up`")
    return Finding("redis", True, f"{where} Redis {version}")


def check_services_process(stack: Stack) -> Finding:
    """The process running Prefect's background services: without it no schedule fires, whatever its log says."""
    pidfile = stack.run_dir / "prefect-background.pid"
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        pid = None
    if pid is None or not process_alive(pid):
        return Finding("prefect services process", False,
                       f"not running (no live pid in {pidfile}): no schedule fires and no event is stored; see "
                       f"{stack.services_process_log()} and start it with `make up`")
    return Finding("prefect services process", True, f"pid {pid}")


def diagnose(stack: Stack) -> list[Finding]:
    """Every check of a stack from ``make up``, in dependency order."""
    found = [check_postgres(stack), check_redis(stack), check_s3(stack.s3_url, stack.bucket),
             check_mlflow(stack.mlflow_url)]
    found += check_prefect_api(stack.prefect_api)
    found += [check_services_process(stack)]
    found += check_services(stack.services_log())
    if any(f.component == "prefect api" and f.ok for f in found):
        found += check_workers(stack.prefect_api, stack.worker_pools)
    return found


def diagnose_server(api: str, log: Path | None) -> list[Finding]:
    """A Prefect server started some other way (``make ui``, your own): its API and, given its log, services."""
    found = check_prefect_api(api, fix="start it (`make ui` or `prefect server start`) or set PREFECT_API_URL")
    if log is not None:
        found += check_services(log)
    return found
