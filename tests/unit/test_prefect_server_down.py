"""hybridtrain deploy and worker with nothing answering at PREFECT_API_URL: one line naming the URL and the fix.

The commands run as the user runs them (the installed ``hybridtrain``, a subprocess), so a traceback would show.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.bootstrap import check_server
from hybridtrain.errors import HybridtrainError

HYBRIDTRAIN = str(Path(sys.executable).with_name("hybridtrain"))


def dead_api() -> str:
    """An API URL on a loopback port nothing listens on (bound by the kernel's choice, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.relative_to(root).parts}


def hybridtrain(*args: str, api: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_API_URL": api}
    return subprocess.run([HYBRIDTRAIN, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("command", [["deploy"], ["worker", "--pool", "onprem"]], ids=["deploy", "worker"])
def test_a_dead_server_is_one_line_naming_the_url_and_the_fix(workspace, command):
    api = dead_api()
    before = tree(workspace)
    proc = hybridtrain(*command, "--home", str(workspace), api=api)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "ConnectError" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: cannot ") and f"not reachable at {api} " in lines[0]
    assert "nothing answers there" in lines[0] and "make up" in lines[0] and "PREFECT_API_URL" in lines[0]
    assert tree(workspace) == before  # no .hybridtrain/deploy, nothing else


def test_bad_input_is_still_refused_before_the_server_is_asked(workspace):
    proc = hybridtrain("deploy", "--code-repo", "gpu=file:///srv/ml.git", "--home", str(workspace), api=dead_api())
    assert proc.returncode == 2
    assert "pool 'gpu' is not in the sites catalog" in proc.stderr and "not reachable" not in proc.stderr


class _Api(http.server.BaseHTTPRequestHandler):
    ready = 200

    def do_GET(self):
        code, body = (200, b"true") if self.path == "/api/health" else \
            (self.ready, b'{"message": "Database is not available"}') if self.path == "/api/ready" else (404, b"")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api() -> Iterator[tuple[str, type[_Api]]]:
    handler = type("Handler", (_Api,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api", handler
    server.shutdown()
    server.server_close()


def test_a_healthy_server_passes(api):
    url, _ = api
    check_server("deploy", url + "/")  # no error


def test_a_server_without_its_database_is_refused_with_where_to_look(api):
    url, handler = api
    handler.ready = 503
    with pytest.raises(HybridtrainError) as raised:
        check_server("deploy", url)
    text = str(raised.value)
    assert text.startswith("cannot deploy: prefect database ") and f"{url}/ready answered 503" in text
    assert f"hybridtrain doctor --api {url}" in text
