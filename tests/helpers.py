"""Shared test helpers: free ports, starting p2pfed processes, waiting for conditions."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p2pfed(*args: str, log: Path | None = None, prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start `python -m p2pfed ARGS` in its own process group, logging to a file."""
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    return subprocess.Popen([*(prefix or []), sys.executable, "-m", "p2pfed", *args], stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ})


def stop(*procs: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def status(address: str, *extra: str, member: str = "bootstrap",
           prefix: list[str] | None = None) -> dict[str, Any] | None:
    """`p2pfed mesh status --json` of the member named member at address (its public key is read from the key
    home the test shares with the members it started), or None if it does not answer."""
    res = subprocess.run([*(prefix or []), sys.executable, "-m", "p2pfed", "mesh", "status", "--join", address,
                          "--join-key", member, "--json", "--timeout", "2", *extra], capture_output=True, timeout=30)
    if res.returncode != 0:
        return None
    return json.loads(res.stdout)


def peer_states(st: dict[str, Any] | None) -> dict[str, str]:
    return {p["name"]: p["state"] for p in (st or {}).get("peers", [])}


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


async def wait_until(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll pred on the event loop until it holds; fail naming what was awaited after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.02)


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py, a script (tools/ is no package), imported from its file once."""
    spec = importlib.util.spec_from_file_location(f"tools_{name}", Path(__file__).resolve().parents[1] / "tools"
                                                  / f"{name}.py")
    assert spec is not None and spec.loader is not None
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
