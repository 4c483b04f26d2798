"""MQTT discovery: presence parsing (fast) and a real mosquitto announcing a SIGKILLed node (broker)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest

from p2pfed.net.discovery import BrokerAddress, MqttDiscovery, parse_presence
from p2pfed.net.endpoint import Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE, DEAD
from tests.helpers import free_port, p2pfed, peer_states, status, stop, wait_for

PRESENCE = {"name": "n1", "address": "tcp://10.0.0.1:7000", "role": "node", "incarnation": 7, "pubkey": "",
            "state": "alive", "age": 0.0, "round": 0}


def test_presence_is_validated() -> None:
    topic = "p2pfed/m/members/n1"
    assert parse_presence(topic, json.dumps(PRESENCE).encode(), "m")["address"] == PRESENCE["address"]
    for topic_, payload, reason in [
        ("p2pfed/other/members/n1", json.dumps(PRESENCE).encode(), "not under"),
        (topic, b"\x80\x81", "not JSON"),
        (topic, json.dumps({**PRESENCE, "name": "n2"}).encode(), "topic of"),
        (topic, json.dumps({**PRESENCE, "incarnation": "7"}).encode(), "integer"),
        (topic, json.dumps({**PRESENCE, "evil": 1}).encode(), "unexpected"),
        (topic, b"[" * 5000, "exceeds"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_presence(topic_, payload, "m")


def test_broker_address_parsing() -> None:
    assert BrokerAddress.parse("mqtt://broker:1884/lab") == BrokerAddress("broker", 1884, "lab")
    assert BrokerAddress.parse("mqtt://broker/lab").port == 1883
    for bad in ["tcp://broker/lab", "mqtt://broker", "mqtt://broker/a/b"]:
        with pytest.raises(ValueError):
            BrokerAddress.parse(bad)


@pytest.fixture
def mosquitto(tmp_path: Path):
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        pytest.fail("mosquitto is not installed (bash tests/run.sh installs it: apt-get install mosquitto)")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 20, "mosquitto to listen")
        assert proc.poll() is None, f"mosquitto exited with {proc.returncode}"
        yield port
    finally:
        proc.terminate()
        proc.wait(5)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def retained_state(port: int, mesh: str, name: str) -> str | None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.subscribe(f"p2pfed/{mesh}/members/{name}", qos=1)
        try:
            async with asyncio.timeout(1.0):
                async for message in client.messages:
                    return json.loads(message.payload)["state"]  # type: ignore[arg-type]
        except TimeoutError:
            return None
    return None


@pytest.mark.broker
def test_nodes_find_each_other_through_mosquitto_and_its_last_will_announces_a_kill(
    mosquitto: int, tmp_path: Path
) -> None:
    # A slow heartbeat (dead only after 60 s of silence) shows that the broker's will, not the heartbeat
    # timeout, is what tells the others.
    cfg = tmp_path / "node.toml"
    cfg.write_text("[node]\n[node.mesh]\nheartbeat = 10.0\nsuspect_after = 3\ndead_after = 6\n")
    url = f"mqtt://127.0.0.1:{mosquitto}/lab"
    ports = {name: free_port() for name in ["n1", "n2", "n3"]}
    procs = {name: p2pfed("node", "--discovery", url, "--bind", f"tcp://127.0.0.1:{port}", "--name", name,
                          "--config", str(cfg), "--mesh", "lab", log=tmp_path / f"{name}.log")
             for name, port in ports.items()}
    try:
        addr = f"tcp://127.0.0.1:{ports['n1']}"

        def seen() -> dict[str, str]:
            return peer_states(status(addr, "--mesh", "lab", member="n1"))

        wait_for(lambda: seen() == {"n1": "alive", "n2": "alive", "n3": "alive"}, 30, "mesh via MQTT")
        assert asyncio.run(retained_state(mosquitto, "lab", "n3")) == "alive"
        t0 = time.monotonic()
        stop(procs["n3"], sig=signal.SIGKILL)
        # The will comes after the MQTT keepalive (5 s here); each status query is a new process, slow on a
        # loaded machine, so allow 40 s: still well below the 60 s after which silence alone would kill n3.
        wait_for(lambda: seen().get("n3") == "dead", 40, "will of n3")
        assert time.monotonic() - t0 < 45
        assert asyncio.run(retained_state(mosquitto, "lab", "n3")) == "dead"
        assert "broker announces n3 is dead" in (tmp_path / "n2.log").read_text()
    finally:
        stop(*procs.values())


async def test_presence_introduces_a_peer_and_its_will_marks_it_dead(members: Callable[..., Endpoint],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    me = members("n1", options=MeshOptions(heartbeat=0.1))
    await me.start("tcp://127.0.0.1:0")
    peer = members("n2", options=MeshOptions(heartbeat=0.1))
    await peer.start("tcp://127.0.0.1:0")
    discovery = MqttDiscovery(me, "mqtt://127.0.0.1:1/lab")  # never connects: messages are fed by hand
    presence = {**PRESENCE, "name": "n2", "address": peer.address, "incarnation": peer.incarnation,
                "pubkey": peer.keys.public.decode() if peer.keys else ""}
    discovery._on_message("p2pfed/lab/members/n2", json.dumps(presence).encode())
    deadline = time.monotonic() + 5
    while me.peers.peers["n2"].state != ALIVE and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # introduced by the presence, alive once its own heartbeat answers
    assert me.peers.peers["n2"].state == ALIVE
    discovery._on_message("p2pfed/lab/members/n2", json.dumps({**presence, "incarnation": 1}).encode().replace(
        b'"alive"', b'"dead"'))
    assert me.peers.peers["n2"].state == ALIVE  # the will of an older incarnation of n2 changes nothing
    with caplog.at_level(logging.INFO):
        discovery._on_message("p2pfed/lab/members/n2", json.dumps({**presence, "state": "dead"}).encode())
    assert me.peers.peers["n2"].state == DEAD and "broker announces n2 is dead" in caplog.text
    discovery._on_message("p2pfed/lab/members/n1", json.dumps({**PRESENCE, "state": "dead"}).encode())
    discovery._on_message("p2pfed/lab/members/n3", b"")  # a cleared retained message
    discovery._on_message("p2pfed/lab/members/n3", b"{")
    assert set(me.peers.peers) == {"n2"} and "dropped discovery message" in caplog.text
