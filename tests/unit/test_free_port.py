"""free_port: ports for servers that restart on the same port come from outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from hybridtrain.drill import loopback
from hybridtrain.drill.loopback import LOWEST_PORT, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable(tmp_path, monkeypatch):
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("32768\t60999\n")
    monkeypatch.setattr(loopback, "EPHEMERAL_RANGE", fake)
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < 32768 for p in ports)
    assert len(ports) > 1  # drawn at random: two tests choosing at once rarely meet
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_without_room_below_the_range_the_kernel_chooses(tmp_path, monkeypatch):
    real_low = int(loopback.EPHEMERAL_RANGE.read_text().split()[0])  # the kernel's choices come from here
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("10500\t60999\n")  # less than 1000 ports below the range: not worth drawing from
    monkeypatch.setattr(loopback, "EPHEMERAL_RANGE", fake)
    assert free_port() >= real_low
    monkeypatch.setattr(loopback, "EPHEMERAL_RANGE", tmp_path / "missing")  # unreadable: the kernel chooses
    assert free_port() >= real_low
