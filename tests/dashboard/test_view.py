"""What the dashboard page is given: a live mesh's view from the members' statuses over real sockets (a member
whose status breaks the wire's bounds is left out, the rest shown), a run folder's view from its records,
and the command's refusals."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgpack
import pytest

from p2pfed.cli import main
from p2pfed.dashboard.server import MeshWatcher, make_app, serve
from p2pfed.dashboard.view import run_view
from p2pfed.net import transport as transport_module
from p2pfed.net.endpoint import Endpoint, MeshOptions, query_status
from p2pfed.net.progress import Progress
from p2pfed.report.records import append_record
from p2pfed.wire import Message
from p2pfed.wire.messages import check_body
from tests.helpers import wait_until

FAST = MeshOptions(heartbeat=0.1, suspect_after=3, dead_after=6, join_timeout=1.0)


def learned(method: str, chosen: list[str], scores: dict[str, float], curve: list[tuple[int, float, float]]
            ) -> Progress:
    progress = Progress()
    for rnd, accuracy, loss in curve:
        progress.note("round", rnd, {"accuracy": accuracy, "loss": loss}, method)
    progress.note("choice", curve[-1][0], {"chosen": chosen, "scores": scores}, method)
    return progress


def forging(monkeypatch: pytest.MonkeyPatch, sender: str) -> None:
    """Make sender's status replies carry an accuracy of 7 (past the wire's bounds, which its own encoder would
    refuse): the envelope is re-packed after encoding, as a hostile member's own code would send it."""
    real = transport_module.encode

    def encode(msg: Message) -> list:
        frames = real(msg)
        if msg.sender == sender and msg.type == "status":
            envelope = msgpack.unpackb(frames[0])
            envelope["body"]["learning"]["accuracy"] = [7.0]
            frames = [msgpack.packb(envelope), *frames[1:]]
        return frames

    monkeypatch.setattr(transport_module, "encode", encode)


async def test_a_live_mesh_is_seen_through_its_members_statuses(members: Callable[..., Endpoint],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    boot = members("bootstrap", "bootstrap", options=FAST)
    await boot.start("tcp://127.0.0.1:0")
    nodes = {}
    for name in ("n0", "n1", "n2", "liar"):
        nodes[name] = members(name, options=FAST)
        await nodes[name].start("tcp://127.0.0.1:0", [boot.ticket])
    nodes["n0"].serve(progress=learned("pfedlia-p2p", ["n1"], {"n1": 0.5, "n2": -0.25},
                                       [(0, 0.5, 2.0), (1, 0.75, math.nan), (1, 0.8, 1.0)]).body)
    nodes["n1"].serve(progress=learned("pfedlia-p2p", ["n0"], {"n0": 0.4}, [(0, 0.6, 1.5)]).body)
    # n2 names a member nobody knows: not drawn (a member could name a thousand)
    nodes["n2"].serve(progress=learned("pfedlia-p2p", ["ghost"], {"ghost": 1.0}, [(0, 0.3, 2.2)]).body)
    nodes["liar"].serve(progress=learned("pfedlia-p2p", ["n0"], {}, [(0, 0.5, 1.0)]).body)
    forging(monkeypatch, "liar")  # its status breaks the wire's bounds on arrival: refused by the watcher
    await wait_until(lambda: len(boot.peers.live()) == 4, what="all four alive at the bootstrap")
    watcher = MeshWatcher(boot.ticket, every=0.2)
    await watcher.start()
    try:
        view = await watcher.poll()
    finally:
        await watcher.stop()
    assert view["live"] and view["error"] == "" and view["source"] == boot.address
    m = view["methods"]["pfedlia-p2p"]
    assert [x["name"] for x in m["members"]] == ["n0", "n1", "n2"]  # the bootstrap is not a learner
    assert view["methods"]["(not learning yet)"]["members"][0]["name"] == "liar"  # its status was refused
    assert m["chosen"] == {"n0": ["n1"], "n1": ["n0"], "n2": []}
    assert m["groups"]["n0"] == m["groups"]["n1"] != m["groups"]["n2"]
    # round 1's final evaluation replaced its first; a loss that was not finite is unknown (null)
    assert m["curves"]["n0"] == {"rounds": [0, 1], "accuracy": [0.5, 0.8], "loss": [2.0, 1.0]}
    assert m["scores"]["n0"] == {"n1": 0.5, "n2": -0.25} and m["scores"]["n1"] == {"n0": 0.4}
    assert m["scores"]["n2"] == {}
    assert all(x["state"] == "alive" for x in m["members"])


def write_run(run: Path) -> None:
    """A run folder as p2pfed run leaves it: a p2p method's and a coordinated method's records."""
    p2p, central = run / "pfedlia-p2p", run / "fesem"
    for folder in (p2p, central):
        folder.mkdir(parents=True)
    for node, chosen, acc in [("n00", ["n01"], 0.9), ("n01", ["n00"], 0.8), ("n02", [], 0.7)]:
        path = p2p / f"{node}.jsonl"
        append_record(path, "round", node, "pfedlia-p2p", 0, accuracy=acc - 0.2, loss=1.0)
        append_record(path, "choice", node, "pfedlia-p2p", 1, chosen=chosen, scores={"n00": 0.1, "n02": -0.2})
        # n00 had chosen n02 too and dropped it (pfedlia-p2p's choice keeps learning); n01 dropped it, then took it
        # back: each change is a choice record, the last one says what holds
        if node == "n00":
            append_record(path, "choice", node, "pfedlia-p2p", 1, chosen=chosen, scores={}, dropped=["n02"])
        if node == "n01":
            append_record(path, "choice", node, "pfedlia-p2p", 1, chosen=[], scores={}, dropped=["n00", "n02"])
            append_record(path, "choice", node, "pfedlia-p2p", 1, chosen=chosen, scores={}, dropped=[])
        append_record(path, "round", node, "pfedlia-p2p", 1, accuracy=acc, loss=float("nan"))
        append_record(path, "final", node, "pfedlia-p2p", 1, accuracy=acc, loss=0.5, chosen=chosen)
    append_record(central / "coordinator.jsonl", "final", "coordinator", "fesem", 2, assignment={"n00": 1, "n01": 0})
    append_record(central / "n00.jsonl", "round", "n00", "fesem", 2, accuracy=0.5)
    (run / "summary.json").write_text(json.dumps({"methods": {"fesem": {"crashed": {"n00": "killed"}}}}))


def test_a_run_folder_is_seen_through_its_records(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    view = run_view(tmp_path / "run")
    assert not view["live"] and sorted(view["methods"]) == ["fesem", "pfedlia-p2p"]
    m = view["methods"]["pfedlia-p2p"]
    assert m["chosen"] == {"n00": ["n01"], "n01": ["n00"], "n02": []}
    assert m["dropped"] == {"n00": ["n02"]}  # n01 chose n02 again after dropping it
    assert m["groups"]["n00"] == m["groups"]["n01"] != m["groups"]["n02"]
    assert m["curves"]["n00"] == {"rounds": [0, 1], "accuracy": [pytest.approx(0.7), 0.9], "loss": [1.0, 0.5]}
    assert {x["name"]: x["state"] for x in m["members"]} == dict.fromkeys(["n00", "n01", "n02"], "finished")
    c = view["methods"]["fesem"]
    assert c["groups"] == {"n00": 1, "n01": 0} and c["dropped"] == {}  # the coordinator's grouping
    assert [(x["name"], x["role"], x["state"]) for x in c["members"]] == [
        ("coordinator", "coordinator", "finished"), ("n00", "node", "crashed")]
    assert run_view(tmp_path / "run" / "pfedlia-p2p")["methods"].keys() == {"pfedlia-p2p"}  # one method's folder
    with pytest.raises(FileNotFoundError, match="holds no records"):
        run_view(tmp_path)


def test_a_shipped_run_folder_is_seen_as_the_run_was(tmp_path: Path) -> None:
    """p2pfed report --ship keeps the records compressed (n00.jsonl.gz): the dashboard reads them too."""
    write_run(tmp_path / "run")
    shutil.copytree(tmp_path / "run", tmp_path / "shipped")
    for path in (tmp_path / "shipped").rglob("*.jsonl"):  # as ship writes them
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    assert run_view(tmp_path / "shipped")["methods"] == run_view(tmp_path / "run")["methods"]
    assert run_view(tmp_path / "shipped" / "pfedlia-p2p")["methods"].keys() == {"pfedlia-p2p"}


async def test_the_page_and_its_data_are_served(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    stop = asyncio.Event()
    urls: list[str] = []
    server = asyncio.ensure_future(serve(make_app(lambda: run_view(tmp_path / "run")), "127.0.0.1", 0, stop,
                                         urls.append))
    try:
        await wait_until(lambda: bool(urls), what="the server to listen")
        async with aiohttp.ClientSession() as session:
            async with session.get(urls[0]) as page:
                assert page.status == 200 and "p2pfed dashboard" in await page.text()
            async with session.get(urls[0] + "api/view") as data:
                assert (await data.json())["methods"]["pfedlia-p2p"]["chosen"]["n00"] == ["n01"]
            # a page elsewhere that points a name of its own at 127.0.0.1 (DNS rebinding) is not answered
            async with session.get(urls[0] + "api/view", headers={"Host": "evil.example:8050"}) as foreign:
                assert foreign.status == 403
    finally:
        stop.set()
        await server


async def test_a_flood_of_over_long_requests_writes_a_few_short_log_lines(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 200 request lines over aiohttp's limit (8190 bytes) once wrote a traceback each: 144 KB of log
    write_run(tmp_path / "run")
    stop = asyncio.Event()
    urls: list[str] = []
    caplog.set_level(logging.INFO)
    server = asyncio.ensure_future(serve(make_app(lambda: run_view(tmp_path / "run")), "127.0.0.1", 0, stop,
                                         urls.append))
    try:
        await wait_until(lambda: bool(urls), what="the server to listen")
        port = int(urls[0].rsplit(":", 1)[1].strip("/"))
        for _ in range(200):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = await reader.read()  # the server answers and closes
            writer.close()
            assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
        async with aiohttp.ClientSession() as session, session.get(urls[0] + "api/view") as data:
            assert data.status == 200  # a request within the limits is still answered
    finally:
        stop.set()
        await server
    tracebacks, size = caplog.text.count("Traceback"), len(caplog.text)  # counts: a diff of 144 KB takes minutes
    assert (tracebacks, size < 2000) == (0, True), f"{tracebacks} tracebacks, {size} bytes logged"
    assert 1 <= len(caplog.records) <= 10 and all(len(r.getMessage()) < 200 for r in caplog.records)


def test_the_command_refuses_what_it_cannot_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard"]) == 2
    assert "takes --join tcp://HOST:PORT (a live mesh) or a run folder" in capsys.readouterr().err
    assert main(["dashboard", str(tmp_path), "--join", "tcp://127.0.0.1:1"]) == 2
    capsys.readouterr()
    assert main(["dashboard", str(tmp_path)]) == 2
    assert "holds no records" in capsys.readouterr().err


async def test_a_status_is_answered_even_when_the_progress_it_would_tell_is_broken(
        members: Callable[..., Endpoint]) -> None:
    boot = members("bootstrap", "bootstrap", options=FAST)
    await boot.start("tcp://127.0.0.1:0")
    boot.serve(progress=lambda: {"method": "x", "rounds": [-1]})  # a bug: a negative round, keys missing
    reply = await query_status(boot.ticket, timeout=5)
    assert reply.body["name"] == "bootstrap" and "learning" not in reply.body


def test_the_peers_a_node_dropped_travel_in_its_status_within_the_wires_bounds() -> None:
    progress = learned("pfedlia-p2p", ["b", "c"], {"b": 1.0, "c": 0.5, "d": 0.4}, [(5, 0.5, 1.0)])
    assert "dropped" not in progress.body()  # a node that dropped none says nothing (as an older one does)
    progress.note("choice", 8, {"chosen": ["b", "c"], "dropped": ["d"]})
    progress.note("choice", 9, {"chosen": [], "dropped": ["b", "c", "d"]})
    progress.note("choice", 12, {"chosen": ["c"], "dropped": ["b", "d"]})
    progress.note("peer", 12, {"peer": "e", "verdict": "kept out"})  # a record that changes no choice
    body = progress.body()
    assert body["dropped"] == ["b", "d"]
    check_body("status", {"address": "tcp://127.0.0.1:1", "role": "node", "incarnation": 1, "pubkey": "",
                          "round": 12, "heartbeat": 1.0, "name": "a", "peers": [], "learning": body})
    body["dropped"] = ["x" * 500]
    with pytest.raises(ValueError):
        check_body("status", {"address": "tcp://127.0.0.1:1", "role": "node", "incarnation": 1, "pubkey": "",
                              "round": 12, "heartbeat": 1.0, "name": "a", "peers": [], "learning": body})
