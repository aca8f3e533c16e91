"""The fixes for the pinned Prefect: heartbeats are still sent and stop as soon as the run ends;
clients share one TLS context."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


class FakeEngine:
    """Stands in for Prefect's flow run engine: records the heartbeats the context sends."""

    def __init__(self, seconds: int | None, final: bool = False):
        self.heartbeat_seconds = seconds
        self.flow_run = SimpleNamespace(state=SimpleNamespace(is_final=lambda: final))
        self.logger = SimpleNamespace(debug=lambda *a, **k: None)
        self.beats: list[float] = []
        self.first = threading.Event()

    def _build_heartbeat_event_template(self):
        return {"prefect.resource.id": "prefect.flow-run.test"}, []

    def _emit_flow_run_heartbeat(self, resource, related):
        assert resource == {"prefect.resource.id": "prefect.flow-run.test"}
        self.beats.append(time.monotonic())
        self.first.set()


def heartbeat_threads() -> list[threading.Thread]:
    from orchestration.prefect_compat import THREAD_NAME

    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def test_fix_is_active_on_the_pinned_prefect():
    """Fails after a Prefect upgrade: read its heartbeat and client code again, then extend or drop the fixes."""
    from prefect import flow_engine
    from prefect.client.orchestration import PrefectClient, SyncPrefectClient

    from orchestration import prefect_compat

    assert prefect_compat.install() is True
    assert flow_engine._send_heartbeats is prefect_compat.send_heartbeats
    assert PrefectClient.__init__.shares_ssl_context and SyncPrefectClient.__init__.shares_ssl_context
    assert prefect_compat.install() is True  # idempotent: the wrapper is not wrapped again
    assert PrefectClient.__init__.__wrapped__ is prefect_compat.PREFECT_CLIENT_INITS[PrefectClient]


def client_context(client):
    """The TLS context a Prefect client's httpx transport would use."""
    return client._client._transport._pool._ssl_context


def test_clients_share_one_tls_context_built_as_prefect_builds_it(monkeypatch, tmp_path):
    import shutil
    import ssl

    import certifi
    from prefect.client.orchestration import PrefectClient, SyncPrefectClient
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY, temporary_settings

    from orchestration import prefect_compat

    built: list[str | None] = []
    create = ssl.create_default_context

    def counting(*args, cafile=None, **kwargs):
        built.append(cafile)
        return create(*args, cafile=cafile, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setattr(prefect_compat, "_contexts", {})
    default_ca = PREFECT_API_SSL_CERT_FILE.value() or certifi.where()  # it defaults to $SSL_CERT_FILE
    api = "http://127.0.0.1:9/api"
    first, second = SyncPrefectClient(api), SyncPrefectClient(api)
    async_client = PrefectClient(api)
    assert built == [default_ca]  # one context, from the same CA bundle as Prefect's, for all three clients
    shared = client_context(first)
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert client_context(second) is shared and client_context(async_client) is shared

    bundle = tmp_path / "ca.pem"
    shutil.copyfile(certifi.where(), bundle)
    with temporary_settings(updates={PREFECT_API_SSL_CERT_FILE: str(bundle)}):
        own_ca = client_context(SyncPrefectClient(api))
    with temporary_settings(updates={PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
        insecure = client_context(SyncPrefectClient(api))
    assert built == [default_ca, str(bundle), None]  # the settings still decide, as in Prefect
    assert own_ca is not shared and own_ca.verify_mode == ssl.CERT_REQUIRED
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname

    mine = create()
    assert client_context(SyncPrefectClient(api, httpx_settings={"verify": mine})) is mine
    assert len(built) == 3  # a client given its own context is left alone


def test_a_client_with_the_shared_context_talks_to_the_server(prefect_server):
    from prefect.client.orchestration import get_client

    from orchestration import prefect_compat

    assert prefect_compat.install()
    with get_client(sync_client=True) as one, get_client(sync_client=True) as two:
        # The wrapped __init__ still sets up a working client (base URL, headers) around the shared context.
        assert client_context(one) is client_context(two) is prefect_compat.shared_ssl_context()
        assert one.hello().status_code == two.hello().status_code == 200


def test_heartbeats_repeat_each_interval_and_stop_with_the_run(monkeypatch):
    from prefect import flow_engine

    from orchestration.prefect_compat import send_heartbeats

    monkeypatch.setattr(flow_engine, "MINIMUM_HEARTBEAT_INTERVAL", 0)  # Prefect's floor is 30 s
    engine = FakeEngine(seconds=1)
    with send_heartbeats(engine):
        assert engine.first.wait(10), "no heartbeat at the start of the run"
        wait_for(lambda: len(engine.beats) >= 2, 10, "a second heartbeat one interval later")
    assert engine.beats[1] - engine.beats[0] >= 0.9
    assert heartbeat_threads() == []  # so nothing can be sent after the run ended


def test_a_long_interval_does_not_hold_the_end_of_the_run():
    from orchestration.prefect_compat import send_heartbeats

    engine = FakeEngine(seconds=3600)
    with send_heartbeats(engine):
        assert engine.first.wait(10)
    # The exit joins for at most 2 s: a thread still sleeping out its interval would be alive here.
    assert heartbeat_threads() == []
    assert len(engine.beats) == 1


def test_no_heartbeat_once_the_run_is_final_or_when_turned_off():
    from orchestration.prefect_compat import send_heartbeats

    final = FakeEngine(seconds=30, final=True)
    with send_heartbeats(final):
        wait_for(lambda: not heartbeat_threads(), 10, "the heartbeat thread to see the final state")
    assert final.beats == []

    off = FakeEngine(seconds=None)
    with send_heartbeats(off):
        assert heartbeat_threads() == []
    assert off.beats == []


def test_a_real_flow_run_sends_its_heartbeat_to_the_server(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    import flows  # noqa: F401  (as importing any of our flows does: installs the fix)

    seen_during_run: list[int] = []

    @flow
    def beating() -> None:
        seen_during_run.append(len(heartbeat_threads()))

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        state = beating(return_state=True)
    assert state.is_completed()
    assert seen_during_run == [1]
    assert heartbeat_threads() == []
    run_id = state.state_details.flow_run_id
    wanted = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                         resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))

    def heartbeats():
        with get_client(sync_client=True) as client:
            return client.read_events(filter=wanted, limit=10).events  # the server caps a page at 50

    events = wait_for(heartbeats, 60, f"the heartbeat event of flow run {run_id} on the server")
    assert events[0].resource.id == f"prefect.flow-run.{run_id}"


def test_events_reach_the_session_server_after_a_test_pointed_this_process_elsewhere(prefect_server):
    """The suite's own guard (tests/fixtures/prefect_api.py): an events worker started while a test pointed at
    another server (here one that is down) must not keep the rest of the session's events."""
    import uuid
    import warnings

    from prefect.client.orchestration import get_client
    from prefect.events import emit_event
    from prefect.events.filters import EventFilter, EventResourceFilter

    from tests.fixtures.prefect_api import drain_prefect_services, prefect_api_at

    drain_prefect_services(timeout=30)  # as at the start of a session: the next event starts the events worker
    with warnings.catch_warnings(), prefect_api_at("http://127.0.0.1:9/api", drain_timeout_s=2):
        warnings.simplefilter("ignore")  # the dead server's worker may not drain in 2 s: dropped, as intended
        assert emit_event("hybridtrain.test.elsewhere", resource={"prefect.resource.id": "hybridtrain.test.gone"})
    here = f"hybridtrain.test.{uuid.uuid4()}"
    assert emit_event("hybridtrain.test.home", resource={"prefect.resource.id": here})

    def arrived():
        with get_client(sync_client=True) as client:
            return client.read_events(filter=EventFilter(resource=EventResourceFilter(id=[here])), limit=1).events

    wait_for(arrived, 60, "the event emitted after leaving the other server to reach the session's server")
