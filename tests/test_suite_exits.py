"""The suite's last resort holds: a test that leaves a zmq context open fails or passes, it never hangs pytest.

A test stopped by its timeout can leave a context whose Transport object is already collected; with a socket
that still holds an undeliverable message, that context's ``__del__`` waits forever at interpreter exit, and
in CI a regression would look like a hung job instead of a failed test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAKY = textwrap.dedent(
    """
    import zmq

    class Holder:
        pass

    def test_leaves_a_context_with_an_undeliverable_message():
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, -1)
        sock.connect("tcp://127.0.0.1:9")
        sock.send(b"never delivered")
        holder = Holder()
        holder.ctx, holder.sock, holder.me = ctx, sock, holder  # a cycle: only the collector frees it
    """
)


def test_a_context_left_open_by_a_test_does_not_hang_the_session(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    # -p tests.conftest: the project's conftest as a plugin, so its session hooks run for a file outside tests/
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    command += ["-c", str(tmp_path / "none.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_leaky.py")]
    (tmp_path / "none.ini").write_text("[pytest]\n")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
