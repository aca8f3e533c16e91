"""Stack launcher: `make up` / `make down` / `make status` — the served control plane on loopback.

    python scripts/stack.py up [--home DIR] [--prefect-port N ...] [--workers-per-pool N] [--no-deploy]
    python scripts/stack.py down [--home DIR]
    python scripts/stack.py status [--home DIR]

`up` starts, in order and each only if not already running: PostgreSQL 15 (Debian's binaries; a
cluster in .hybridtrain/stack/postgres, run as the `postgres` user when started as root), Redis
(Debian's; Prefect's event messaging, leases and task queue, append-only file in
.hybridtrain/stack/redis), the S3 stand-in (moto server mode; the bucket is created and the objects
saved by the last `down` put back), `mlflow server` (PostgreSQL backend store, artifacts proxied to
S3), `prefect server start --no-services` (the API and UI, on PostgreSQL) and `prefect server
services start` (scheduler, late runs, event persister, triggers, ... in a process of their own),
then `hybridtrain deploy` (pools, blocks, deployments with their schedules) and process workers per
pool, and ends with `hybridtrain doctor`. Ports are free ones
picked on the first `up` (or given), kept in .hybridtrain/stack/stack.json for every later one.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybridtrain.errors import HybridtrainError  # noqa: E402
from hybridtrain.service.stack import DATABASES, Stack, logging_config, process_alive  # noqa: E402

START_TIMEOUT_S = float(os.environ.get("HYBRIDTRAIN_STACK_START_TIMEOUT_S", "180"))


def say(msg: str) -> None:
    print(f"stack: {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for(what: str, ok, proc: subprocess.Popen | None = None, log: Path | None = None,
             timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.is_file() else ""
            raise SystemExit(f"stack: {what} exited with {proc.returncode} while starting; log {log}:\n{tail}")
        time.sleep(0.2)
    raise SystemExit(f"stack: {what} did not come up in {timeout:.0f} s; see {log}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


# -- pid files ------------------------------------------------------------------------------------

def pid_of(stack: Stack, name: str) -> int | None:
    f = stack.run_dir / f"{name}.pid"
    try:
        pid = int(f.read_text())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) else None


def spawn(stack: Stack, name: str, cmd: list[str], env: dict[str, str], nice: int = 0,
          cpus: list[int] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own session (so `down` can stop it with everything it started), ``nice`` lower in
    CPU priority and on ``cpus`` only (None: all), both inherited by what it starts."""
    stack.logs.mkdir(parents=True, exist_ok=True)
    stack.run_dir.mkdir(parents=True, exist_ok=True)
    log = stack.logs / f"{name}.log"
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    if cpus is not None:
        cmd = ["taskset", "--cpu-list", ",".join(map(str, cpus)), *cmd]  # util-linux, beside nice (coreutils)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, cwd=stack.root, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    (stack.run_dir / f"{name}.pid").write_text(str(proc.pid))
    return proc


def stop(stack: Stack, name: str, grace_s: float = 15.0) -> bool:
    """SIGTERM the process group of ``name``, SIGKILL after ``grace_s``; True if it was running."""
    pid = pid_of(stack, name)
    (stack.run_dir / f"{name}.pid").unlink(missing_ok=True)
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if this process started it (a zombie still counts as alive)
        except ChildProcessError:
            pass
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


# -- PostgreSQL -----------------------------------------------------------------------------------

def as_pg_user(stack: Stack, cmd: list[str]) -> list[str]:
    return ["runuser", "-u", stack.pg_os_user, "--", *cmd] if stack.pg_os_user else cmd


def pg_run(stack: Stack, cmd: list[str]) -> None:
    proc = subprocess.run(as_pg_user(stack, cmd), capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"stack: {' '.join(cmd[:2])} failed (exit {proc.returncode}): {proc.stderr[-2000:]}"
                         f"{proc.stdout[-1000:]}")


def check_traversable(stack: Stack) -> None:
    """PostgreSQL runs as another user: every directory above its own must let that user pass."""
    if not stack.pg_os_user:
        return
    for d in [stack.pg_dir.parent, *stack.pg_dir.parent.parents]:
        if d.exists() and not (d.stat().st_mode & 0o001):
            raise SystemExit(f"stack: PostgreSQL runs as user {stack.pg_os_user!r}, which cannot enter {d} "
                             f"(mode {oct(d.stat().st_mode & 0o777)}); allow it with `chmod o+x {d}` or put the "
                             "workspace elsewhere")


def start_postgres(stack: Stack) -> None:
    pg = Path(stack.pg_bin)
    check_traversable(stack)
    stack.pg_dir.mkdir(parents=True, exist_ok=True)
    if stack.pg_os_user:
        pw = pwd.getpwnam(stack.pg_os_user)
        os.chown(stack.pg_dir, pw.pw_uid, pw.pw_gid)
    stack.pg_dir.chmod(0o700)
    if not (stack.pg_data / "PG_VERSION").is_file():
        pwfile = stack.pg_dir / "pwfile"
        pwfile.write_text(stack.db_password + "\n")
        if stack.pg_os_user:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        pwfile.chmod(0o600)
        try:
            pg_run(stack, [str(pg / "initdb"), "-D", str(stack.pg_data), "-U", stack.db_user, f"--pwfile={pwfile}",
                           "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"])
        finally:
            pwfile.unlink(missing_ok=True)
        say(f"initialised PostgreSQL cluster in {stack.pg_data}")
    if port_open(stack.host, stack.postgres_port) and (stack.pg_data / "postmaster.pid").is_file():
        say(f"postgres already running on {stack.host}:{stack.postgres_port}")
    else:
        opts = (f"-p {stack.postgres_port} -c listen_addresses={stack.host} -c unix_socket_directories='' "
                "-c max_connections=300 -c shared_buffers=64MB -c fsync=on")
        pg_run(stack, [str(pg / "pg_ctl"), "-D", str(stack.pg_data), "-l", str(stack.pg_dir / "postgres.log"),
                       "-o", opts, "-w", "-t", "60", "start"])
        say(f"postgres on {stack.host}:{stack.postgres_port}")
    import psycopg2

    conn = psycopg2.connect(host=stack.host, port=stack.postgres_port, user=stack.db_user,
                            password=stack.db_password, dbname="postgres", connect_timeout=10)
    conn.autocommit = True
    with conn.cursor() as cur:
        for db in DATABASES:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{db}"')
                say(f"created database {db}")
    conn.close()


def stop_postgres(stack: Stack) -> bool:
    if not (stack.pg_data / "postmaster.pid").is_file():
        return False
    pg_run(stack, [str(Path(stack.pg_bin) / "pg_ctl"), "-D", str(stack.pg_data), "-m", "fast", "-w", "stop"])
    return True


# -- Redis ----------------------------------------------------------------------------------------

def redis_ping(stack: Stack) -> bool:
    from hybridtrain.service.doctor import check_redis

    return check_redis(stack).ok


def start_redis(stack: Stack) -> None:
    if pid_of(stack, "redis") and redis_ping(stack):
        say(f"redis already running on {stack.host}:{stack.redis_port}")
        return
    stack.redis_dir.mkdir(parents=True, exist_ok=True)
    stack.redis_dir.chmod(0o700)
    conf = stack.redis_dir / "redis.conf"
    conf.touch(mode=0o600, exist_ok=True)
    conf.chmod(0o600)
    conf.write_text(stack.redis_conf())
    proc = spawn(stack, "redis", stack.redis_cmd(), {})
    wait_for("redis", lambda: redis_ping(stack), proc, stack.logs / "redis.log")
    say(f"redis on {stack.host}:{stack.redis_port} (Prefect's events, leases and task queue)")


# -- S3 stand-in ----------------------------------------------------------------------------------

def s3_client(stack: Stack):
    import boto3
    from botocore.config import Config

    # moto answers a busy moment with a 500 now and then: botocore's standard mode retries those.
    return boto3.client("s3", endpoint_url=stack.s3_url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1",
                        config=Config(retries={"max_attempts": 8, "mode": "standard"}))


def start_s3(stack: Stack) -> None:
    if pid_of(stack, "s3") and port_open(stack.host, stack.s3_port):
        say(f"s3 already running at {stack.s3_url}")
        return
    proc = spawn(stack, "s3", stack.s3_cmd(), stack.s3_env())
    wait_for("s3 (moto)", lambda: http_ok(f"{stack.s3_url}/moto-api/data.json"), proc, stack.logs / "s3.log")
    client = s3_client(stack)
    client.create_bucket(Bucket=stack.bucket)
    restored = 0
    if stack.s3_snapshot.is_dir():
        for f in sorted(p for p in stack.s3_snapshot.rglob("*") if p.is_file()):
            client.upload_file(str(f), stack.bucket, f.relative_to(stack.s3_snapshot).as_posix())
            restored += 1
    client.close()
    say(f"s3 at {stack.s3_url}, bucket {stack.bucket}" + (f" ({restored} objects restored)" if restored else ""))


def save_s3(stack: Stack) -> int:
    """Copy every object of the bucket to the snapshot directory (moto keeps state in memory only).

    The copy is written beside the snapshot and swapped in only once complete: a failure leaves the
    last snapshot as it was.
    """
    client = s3_client(stack)
    tmp = stack.s3_snapshot.with_name("s3.saving")
    shutil.rmtree(tmp, ignore_errors=True)
    count = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=stack.bucket):
            for obj in page.get("Contents", []):
                dest = tmp / obj["Key"]
                dest.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(stack.bucket, obj["Key"], str(dest))
                count += 1
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        client.close()  # an open keep-alive connection holds moto's exit on SIGTERM until the grace runs out
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(stack.s3_snapshot, ignore_errors=True)
    tmp.replace(stack.s3_snapshot)
    return count


def stop_s3(stack: Stack) -> bool:
    """Save the bucket, then stop the S3 stand-in; if it cannot be saved, leave it running (its objects live
    only in its memory) and say so. True when it is stopped or was not running."""
    if not pid_of(stack, "s3"):
        return True
    if not port_open(stack.host, stack.s3_port):  # dead or never listened: nothing left to save
        stop(stack, "s3")
        say(f"stopped s3 (it was not answering; {stack.s3_snapshot} holds the objects saved by the last `down`)")
        return True
    try:
        count = save_s3(stack)
    except Exception as exc:  # noqa: BLE001 - any failure to read the bucket: keep the objects where they are
        reason = " ".join(str(exc).split())[:200]
        say(f"s3 NOT stopped: saving its objects failed ({type(exc).__name__}: {reason}); it keeps them at "
            f"{stack.s3_url} and {stack.s3_snapshot} is unchanged; run `make down` again to retry")
        return False
    stop(stack, "s3")
    say(f"stopped s3 (saved {count} objects to {stack.s3_snapshot})")
    return True


# -- MLflow, Prefect, workers ---------------------------------------------------------------------

def start_mlflow(stack: Stack) -> None:
    if pid_of(stack, "mlflow") and http_ok(f"{stack.mlflow_url}/health"):
        say(f"mlflow already running at {stack.mlflow_url}")
        return
    # No job runner (huey consumers for MLflow's GenAI jobs): nothing here uses them.
    env = {**stack.s3_env(), "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = spawn(stack, "mlflow", stack.mlflow_cmd(), env)
    wait_for("mlflow server", lambda: http_ok(f"{stack.mlflow_url}/health"), proc, stack.logs / "mlflow.log")
    say(f"mlflow at {stack.mlflow_url} (backend PostgreSQL, artifacts s3://{stack.bucket}/mlflow)")


PREPARE_PREFECT_DB = """
import asyncio

from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration


async def main():
    db = provide_database_interface()
    await db.create_db()
    async with await db.session() as session:
        await run_block_auto_registration(session=session)


asyncio.run(main())
"""


def start_prefect(stack: Stack) -> None:
    if pid_of(stack, "prefect-server") and http_ok(f"{stack.prefect_api}/health"):
        say(f"prefect server already running at {stack.prefect_api}")
        return
    stack.prefect_home.mkdir(parents=True, exist_ok=True)
    stack.logs.mkdir(parents=True, exist_ok=True)
    (stack.state / "prefect-logging.yml").write_text(logging_config(stack.services_log()))
    env = stack.prefect_server_env()
    if stack.api_workers > 1:
        # Each API process migrates the database and registers the block types as it starts; several at
        # once on a new database race (duplicate alembic_version, uq_block_type__slug) and the server
        # exits. Do both once here, as the server's own start-up does, then start them without.
        proc = subprocess.run([sys.executable, "-c", PREPARE_PREFECT_DB], env={**os.environ, **env},
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise SystemExit(f"stack: preparing Prefect's database failed (exit {proc.returncode}):\n"
                             f"{(proc.stdout + proc.stderr)[-3000:]}")
        env["PREFECT_SERVER_DATABASE_MIGRATE_ON_START"] = "false"
        env["PREFECT_SERVER_REGISTER_BLOCKS_ON_START"] = "false"
    proc = spawn(stack, "prefect-server", stack.prefect_server_cmd(), env)
    wait_for("prefect server", lambda: http_ok(f"{stack.prefect_api}/ready"), proc, stack.server_log())
    say(f"prefect server at {stack.prefect_api} (UI http://{stack.host}:{stack.prefect_port}), database PostgreSQL, "
        f"{stack.api_workers} API process(es)")


def start_services(stack: Stack) -> None:
    """Prefect's background services in a process of their own (started after the API has migrated the database)."""
    if pid_of(stack, "prefect-background"):
        say("prefect services already running")
        return
    log = stack.services_process_log()
    before = log.stat().st_size if log.is_file() else 0  # the log is appended to by every `up`

    def started() -> bool:
        with log.open("rb") as fh:
            fh.seek(before)
            return b"Starting services" in fh.read()

    proc = spawn(stack, "prefect-background", stack.prefect_services_cmd(), stack.prefect_server_env())
    wait_for("prefect services", started, proc, log)
    say(f"prefect services running (pid {proc.pid}; each service's runs in {stack.services_log()})")


def deploy(stack: Stack) -> None:
    env = {**os.environ, **stack.client_env()}
    env.pop("PREFECT_HOME", None)
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli", "deploy", "--home", str(stack.root)],
                          cwd=stack.root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"stack: `hybridtrain deploy` failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"\n{proc.stderr[-3000:]}")
    say("deployed pools, blocks and deployments (`hybridtrain deploy`)")


def start_workers(stack: Stack) -> int:
    """Start what is not running; the number of workers the stack has."""
    started = []
    for name, cmd in stack.warm_cmds().items():
        pool = name.removeprefix("warm-")
        if not pid_of(stack, name):
            sock = stack.warm_socket(pool)
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.parent.chmod(0o700)
            proc = spawn(stack, name, cmd, stack.worker_env(pool), stack.nice_of(pool), stack.cpus_of(pool))
            wait_for(f"warm pool {pool}", sock.exists, proc, stack.logs / f"{name}.log", timeout=120)
    limits = pool_limits(stack)
    cmds = stack.worker_cmds(limits)
    for name, cmd in cmds.items():
        if pid_of(stack, name):
            continue
        pool = name.split("-")[1]
        spawn(stack, name, cmd, stack.worker_env(pool), stack.nice_of(pool), stack.cpus_of(pool))
        started.append(name)
    names = ", ".join(f"{n} (--limit {c[c.index('--limit') + 1]})" if "--limit" in c else n for n, c in cmds.items())
    say(f"workers: {names}" + (f" ({len(started)} started)" if started else " (running)"))
    return len(cmds)


def pool_limits(stack: Stack) -> dict[str, int | None]:
    """Each site pool's run limit as the server has it (``hybridtrain deploy`` sets it from the sites'
    GPUs; a user may change it in the UI). A pool the server does not know yet: no limit."""
    limits: dict[str, int | None] = {}
    for pool in stack.worker_pools:
        try:
            with urllib.request.urlopen(f"{stack.prefect_api}/work_pools/{pool}", timeout=10) as resp:
                limits[pool] = json.loads(resp.read()).get("concurrency_limit")
        except OSError:
            limits[pool] = None
    return limits


def doctor(stack: Stack) -> int:
    env = {**os.environ, **stack.client_env()}
    return subprocess.run([sys.executable, "-m", "orchestration.cli", "doctor", "--home", str(stack.root)],
                          cwd=stack.root, env=env).returncode


def cpu_list(text: str) -> list[int]:
    """``--site-cpus``: ``all`` (``[]``: no pinning), or CPU numbers and ranges (``1``, ``2-7,9``) this process
    may run on, leaving at least one of them to the control plane."""
    usable = sorted(os.sched_getaffinity(0))
    shown = ",".join(map(str, usable))
    if text.strip().lower() == "all":
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list: give numbers and ranges such as 1 or "
                                             f"2-7,9 (this host's CPUs: {shown})")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus or not cpus <= set(usable):
        raise argparse.ArgumentTypeError(f"{text!r} names CPUs this host does not have: pick from {shown}")
    if cpus == set(usable):
        raise argparse.ArgumentTypeError(f"{text!r} is every CPU, which leaves the control plane none of its own: "
                                         f"pick fewer of {shown}, or `all` for no pinning")
    return sorted(cpus)


# -- commands -------------------------------------------------------------------------------------

def resolve(args: argparse.Namespace) -> Stack:
    root = Path(args.home or os.environ.get("HYBRIDTRAIN_HOME") or os.getcwd()).resolve()
    stack = Stack.load(root)
    if stack is None:
        if args.command != "up":
            raise SystemExit(f"stack: no stack in {Stack.file(root)}; start one with `make up`")
        ports = {k: getattr(args, f"{k}_port") or free_port() for k in ("prefect", "mlflow", "postgres", "s3", "redis")}
        stack = Stack.create(root, ports, is_root=os.geteuid() == 0)
    if stack.redis_port is None and args.command == "up":  # saved before the stack had Redis
        stack = stack.model_copy(update={"redis_port": args.redis_port or free_port()})
    changes = {k: v for k, v in {"prefect_port": args.prefect_port, "mlflow_port": args.mlflow_port,
                                 "postgres_port": args.postgres_port, "s3_port": args.s3_port,
                                 "redis_port": args.redis_port, "api_workers": args.api_workers,
                                 "workers_per_pool": args.workers_per_pool,
                                 "worker_query_seconds": args.worker_query_seconds,
                                 "site_query_seconds": args.site_query_seconds,
                                 "warm_spares": args.warm_spares, "site_nice": args.site_nice,
                                 "site_cpus": args.site_cpus}.items() if v is not None}
    if changes.get("site_cpus") == []:  # `--site-cpus all`
        changes["site_cpus"] = None
    if changes and args.command == "up":
        stack = stack.model_copy(update=changes)
    return stack


def up(stack: Stack, args: argparse.Namespace) -> int:
    stack.save()
    start_postgres(stack)
    start_redis(stack)
    start_s3(stack)
    start_mlflow(stack)
    start_prefect(stack)
    start_services(stack)
    if not args.no_deploy:
        deploy(stack)
    workers = start_workers(stack) if not args.no_workers else 0
    print(f"\nPrefect UI   http://{stack.host}:{stack.prefect_port}\nMLflow UI    {stack.mlflow_url}\n"
          f"export PREFECT_API_URL={stack.prefect_api} HYBRIDTRAIN_MLFLOW_TRACKING_URI={stack.mlflow_url}\n"
          f"Logs in {stack.logs}; stop with `make down`.\n", flush=True)
    # Workers register on their first poll: `up` returns once they are online (or after 60 s).
    if not args.no_workers:
        wait_workers(stack, workers)
    return 0 if args.no_doctor else doctor(stack)


def wait_workers(stack: Stack, expected: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        online = 0
        for pool in stack.worker_pools:
            req = urllib.request.Request(f"{stack.prefect_api}/work_pools/{pool}/workers/filter", data=b"{}",
                                         method="POST", headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    online += sum(w.get("status") == "ONLINE" for w in json.loads(resp.read()))
            except OSError:
                pass
        if online >= expected:
            return
        time.sleep(0.5)


def down(stack: Stack) -> int:
    """Stop every part, workers first; a part that fails to stop does not keep the others running."""
    failed: list[str] = []

    def attempt(part: str, action) -> object:
        try:
            return action()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - say it in one line, go on with the other parts
            failed.append(part)
            say(f"{part}: could not stop it cleanly ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
            return None

    def stop_workers() -> list[str]:
        workers = [n for n in stack.worker_cmds() if stop(stack, n, grace_s=20)]
        extra = [p.stem for p in stack.run_dir.glob("worker-*.pid")]  # workers from an `up` with more per pool
        return workers + [n for n in extra if stop(stack, n, grace_s=20)]

    workers = attempt("workers", stop_workers) or []
    if workers:
        say(f"stopped {len(workers)} workers")
        crashed = attempt("prefect-server", lambda: mark_orphans_crashed(stack))
        if crashed:
            say(f"marked {crashed} flow runs the stopped workers were running CRASHED (recover-runs resubmits "
                "lifecycle runs from their checkpoints)")
    for name in [p.stem for p in stack.run_dir.glob("warm-*.pid")]:
        attempt(name, lambda name=name: stop(stack, name, grace_s=20))
    for name in ("prefect-background", "prefect-server", "mlflow"):
        if attempt(name, lambda name=name: stop(stack, name)):
            say(f"stopped {name}")
    if attempt("redis", lambda: stop(stack, "redis")):  # it writes its append-only file as it stops
        say("stopped redis")
    if attempt("s3", lambda: stop_s3(stack)) is False:
        failed.append("s3")
    if attempt("postgres", lambda: stop_postgres(stack)):
        say("stopped postgres")
    return 1 if failed else 0


def mark_orphans_crashed(stack: Stack) -> int:
    """Runs left PENDING/RUNNING in the stack's pools once its workers are gone would hold pool slots forever."""
    def call(method: str, path: str, body: dict) -> object:
        req = urllib.request.Request(f"{stack.prefect_api}{path}", data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    try:
        runs = call("POST", "/flow_runs/filter", {
            "flow_runs": {"state": {"type": {"any_": ["PENDING", "RUNNING", "CANCELLING"]}}},
            "work_pools": {"name": {"any_": list(stack.worker_pools)}}, "limit": 200})
        for run in runs:
            call("POST", f"/flow_runs/{run['id']}/set_state",
                 {"state": {"type": "CRASHED", "message": "its worker was stopped by `make down`"}, "force": True})
    except OSError as exc:
        say(f"could not mark the stopped workers' runs crashed ({exc}); recover-runs will find them")
        return 0
    return len(runs)


def status(stack: Stack) -> int:
    rows = [("postgres", (stack.pg_data / "postmaster.pid").is_file() and port_open(stack.host, stack.postgres_port),
             f"{stack.host}:{stack.postgres_port}"),
            ("redis", stack.redis_port is not None and redis_ping(stack), f"{stack.host}:{stack.redis_port}"),
            ("s3", http_ok(f"{stack.s3_url}/moto-api/data.json"), stack.s3_url),
            ("mlflow", http_ok(f"{stack.mlflow_url}/health"), stack.mlflow_url),
            ("prefect-server", http_ok(f"{stack.prefect_api}/health"), stack.prefect_api)]
    rows += [(n, pid_of(stack, n) is not None, f"pid {pid_of(stack, n)}")
             for n in ["prefect-background", *stack.warm_cmds(), *stack.worker_cmds()]]
    for name, ok, where in rows:
        print(f"{name:18} {'up  ' if ok else 'down'}  {where}")
    return 0 if all(ok for _, ok, _ in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--home", help="Workspace root (default: HYBRIDTRAIN_HOME or cwd).")
    for k in ("prefect", "mlflow", "postgres", "s3", "redis"):
        ap.add_argument(f"--{k}-port", type=int, default=int(os.environ[f"HYBRIDTRAIN_STACK_{k.upper()}_PORT"])
                        if os.environ.get(f"HYBRIDTRAIN_STACK_{k.upper()}_PORT") else None, help=f"{k} port (default: kept or free).")
    ap.add_argument("--workers-per-pool", type=int)
    ap.add_argument("--api-workers", type=int, help="Processes serving Prefect's API (default 2).")
    ap.add_argument("--worker-query-seconds", type=float, help="Poll interval of the control pool's worker (default 1).")
    ap.add_argument("--site-query-seconds", type=float, help="Poll interval of the site pools' workers (default 1).")
    ap.add_argument("--warm-spares", type=int, help="Pre-started spare processes per pool (0: start runs cold).")
    ap.add_argument("--site-nice", type=int, choices=range(20), metavar="0-19",
                    help="CPU niceness of the site pools' workers and their runs (default 10: the control plane "
                         "keeps the CPU it needs on a shared host; 0: equal shares).")
    ap.add_argument("--site-cpus", type=cpu_list, metavar="LIST",
                    help="CPUs the site pools' workers and their runs may use, e.g. 1 or 2-7,9 (default: all; "
                         "`all` undoes an earlier setting). Leave the control plane a core of its own on a shared host.")
    ap.add_argument("--no-deploy", action="store_true", help="Skip `hybridtrain deploy`.")
    ap.add_argument("--no-workers", action="store_true", help="Start no workers.")
    ap.add_argument("--no-doctor", action="store_true", help="Skip the final `hybridtrain doctor`.")
    args = ap.parse_args(argv)
    try:
        stack = resolve(args)
    except HybridtrainError as exc:
        raise SystemExit(f"stack: {exc}") from None
    return {"up": lambda: up(stack, args), "down": lambda: down(stack), "status": lambda: status(stack)}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
