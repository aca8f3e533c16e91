"""Shared fixtures: quiet telemetry, a throwaway workspace with the project's configs, one Prefect server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.fixtures.cloud_fleet import image_sshd  # noqa: F401 - a fixture (module scope) of the cloud-instance tests
from tests.fixtures.prefect_api import drain_prefect_services
from tests.fixtures.workspaces import make_workspace

# Shared fixtures, one plugin per concept (tests/fixtures/); test modules never import each other.
pytest_plugins = ["tests.fixtures.training_data", "tests.fixtures.placement_cases", "tests.fixtures.gate_cases",
                  "tests.fixtures.ssh_job"]


os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GIT_AUTHOR_NAME", "hybridtrain-tests")
os.environ.setdefault("GIT_AUTHOR_EMAIL", "tests@hybridtrain.invalid")
os.environ.setdefault("GIT_COMMITTER_NAME", "hybridtrain-tests")
os.environ.setdefault("GIT_COMMITTER_EMAIL", "tests@hybridtrain.invalid")


# The files that take minutes, longest first (seconds of a clean-clone `make test`, 2 workers). With
# `--no-loadscope-reorder` (the Makefile's) xdist hands files to workers in collection order: starting
# these first keeps the run from ending with one worker alone on a long file while the other idles.
LONGEST_FIRST = (
    "tests/service/test_served_stack.py",  # 600
    "tests/integration/test_recovery.py",  # 465
    "tests/federated/test_federated_pools.py",  # 445
    "tests/integration/test_pools.py",  # 415
    "tests/integration/test_fresh_clone.py",  # 405
    "tests/service/test_sites_on_separate_hosts.py",  # 205
    "tests/integration/test_faults.py",  # 185
    "tests/integration/test_cloud_multinode.py",  # 170
    "tests/integration/test_drill.py",  # 170
    "tests/integration/test_federated_ssh.py",  # 160
    "tests/ui/test_browser.py",  # 155
    "tests/flows/test_placement_and_burst.py",  # 145
    "tests/flows/test_demo.py",  # 145
    "tests/integration/test_ssh_site.py",  # 135
    "tests/integration/test_multinode.py",  # 135
    "tests/flows/test_lifecycle.py",  # 125
    "tests/integration/test_warm_launcher.py",  # 110
    "tests/integration/test_sweep_pools.py",  # 100
    "tests/flows/test_bootstrap.py",  # 95
    "tests/integration/test_serving_worker.py",  # 85
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (``LONGEST_FIRST``), every other file after them in its usual order; the
    tests inside a file keep theirs (module fixtures count on it)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator[str]:
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "hybridtrain")
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    # As Prefect's own test suite does: no flow-run heartbeats in tests (one thread and one event per
    # flow run that nothing here reads). tests/flows/test_prefect_compat.py turns them on to test them.
    with _test_server(), temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield PREFECT_API_URL.value()
        drain_prefect_services(timeout=60)  # before the harness's own drain, which has no limit


@contextmanager
def _test_server() -> Iterator[None]:
    """The session's Prefect server: on PostgreSQL, as the served stack runs it, when the server binaries are here.

    Prefect's own harness keeps its database in SQLite, whose writers wait on each other with a 60-s
    busy timeout: with a few workers and warm pools writing at once, API calls stalled for 60 s
    (`tests/federated/test_federated_pools.py` met one to four such stalls a run). Without PostgreSQL
    (a machine that never ran `scripts/setup-system.sh`), Prefect's SQLite harness.
    """
    from prefect.testing.utilities import prefect_test_harness

    from tests.fixtures.postgres import pg_tool, postgres_cluster

    if pg_tool("initdb") is None or os.environ.get("HYBRIDTRAIN_TEST_PREFECT_DB") == "sqlite":
        with prefect_test_harness(server_startup_timeout=180):
            yield
        return
    import prefect.context
    import prefect.settings
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.dependencies import temporary_database_interface
    from prefect.testing.utilities import _find_available_port

    # As prefect.testing.utilities.prefect_test_harness does, with the database URL the only change.
    with postgres_cluster() as url, ExitStack() as stack:
        stack.enter_context(temporary_database_interface())
        stack.enter_context(prefect.settings.temporary_settings(updates={
            prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL: url.replace("postgresql://",
                                                                                 "postgresql+asyncpg://")}))
        server = SubprocessASGIServer(port=_find_available_port())
        prior = SubprocessASGIServer._instances.get(None)
        SubprocessASGIServer._instances[None] = server
        server.start(timeout=180)
        try:
            stack.enter_context(prefect.settings.temporary_settings(
                updates={prefect.settings.PREFECT_API_URL: server.api_url}))
            stack.enter_context(prefect.context._temporary_global_settings_context(
                prefect.context.get_settings_context()))
            yield
        finally:
            server.stop()
            if prior is not None:
                SubprocessASGIServer._instances[None] = prior
            else:
                SubprocessASGIServer._instances.pop(None, None)


@pytest.fixture(scope="session")
def pseudonym_key(prefect_server, tmp_path_factory) -> None:
    from blocks.register import ensure_pseudonym_key, ensure_release_key

    ensure_pseudonym_key("hybridtrain-pseudonym-key")
    # Tests' workspaces read the public key from their own .hybridtrain/keys; the block is shared.
    ensure_release_key("hybridtrain-release-signing-key", tmp_path_factory.mktemp("keys") / "release.pub.pem")
