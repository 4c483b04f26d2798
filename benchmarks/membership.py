"""What membership costs as a mesh grows: messages and bytes per member per second against N.

For each mesh size N and each membership form (interleaved: every size measures "all", then "probe"), a
bootstrap and N members start in one process (one event loop, real sockets on TCP loopback, CURVE keys
unless --insecure) and join. Once every member knows every other as alive, and --settle seconds later (the
news of the joins told out: the steady cost is counted, not the forming), the membership messages each
member sends (hello, welcome, heartbeat, gossip, ping, pong, leave) are counted over --window seconds, from
the transports' own counters. Printed and written per N: messages and bytes per member per second, by type,
the connections each member holds, the process's open files and CPU share, and how long the mesh took to
form. A membership whose cost per member is flat in N shows the same figures on every row; one that
heartbeats everyone grows linearly in N (and its gossip bytes faster, when it gossips whole tables).

Each size and form runs in a process of its own. All of its members share that process and the machine's
cores, so past some N the loop cannot keep up and sends less than it means to: the CPU column says when (a
share near 1.0 per core is saturation), and the figures are counted, not nominal.

Run: python benchmarks/membership.py [--sizes 10,20,40,80] [--window 10] [--membership all,probe]
         [--json benchmarks/results/membership.json] [--plot docs/membership.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from p2pfed.net.endpoint import KEEPING, Endpoint, MeshOptions
from p2pfed.net.membership import ALIVE

KINDS = sorted(KEEPING)  # what members send to keep their tables


def open_files() -> int:
    """This process's open file descriptors."""
    return len(os.listdir("/proc/self/fd"))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def counted(members: list[Endpoint]) -> tuple[Counter[str], Counter[str]]:
    """Messages and bytes sent by the members, by type, so far."""
    messages: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for member in members:
        messages.update(member.transport.sent)
        sizes.update(member.transport.sent_bytes)
    return messages, sizes


async def measure(n: int, membership: str, window: float, settle: float, heartbeat: float, insecure: bool,
                  form_timeout: float) -> dict[str, Any]:
    """Start a bootstrap and n members, wait until each knows every other alive, count one window."""
    options = MeshOptions(heartbeat=heartbeat, insecure=insecure, join_timeout=10.0, membership=membership)
    t0 = time.monotonic()
    boot = Endpoint("bootstrap", "bootstrap", options=options)
    await boot.start("tcp://127.0.0.1:0")
    members = [Endpoint(f"n{i:04d}", options=options) for i in range(n)]
    for member in members:
        await member.start("tcp://127.0.0.1:0", [boot.ticket])
    everyone = [boot, *members]
    formed = None
    try:
        while time.monotonic() - t0 < form_timeout:
            if all(sum(p.state == ALIVE for p in m.peers.peers.values()) == n for m in everyone):
                formed = time.monotonic() - t0
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(settle)  # the news of the joins told out: a steady mesh is counted, not its forming
        before, before_bytes = counted(everyone)
        cpu0, w0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(window)
        elapsed, cpu = time.monotonic() - w0, cpu_seconds() - cpu0
        after, after_bytes = counted(everyone)
        live = sum(sum(p.state == ALIVE for p in m.peers.peers.values()) for m in members) / n
        per = len(everyone) * elapsed  # member-seconds
        messages = {k: (after[k] - before[k]) / per for k in KINDS}
        sizes = {k: (after_bytes[k] - before_bytes[k]) / per for k in KINDS}
        return {
            "members": n, "membership": membership, "formed_s": formed, "window_s": elapsed, "alive_known_mean": live,
            "messages_per_member_s": sum(messages.values()), "bytes_per_member_s": sum(sizes.values()),
            "messages_by_type": messages, "bytes_by_type": sizes,
            "connections_per_member": sum(len(m.transport.dealers) for m in members) / n,
            "open_files": open_files(), "cpu_share": cpu / elapsed,
        }
    finally:
        for member in everyone:
            await member.stop(leave=False)


def measure_apart(n: int, membership: str, args: argparse.Namespace) -> dict[str, Any]:
    """measure() in a process of its own (its open files, memory and CPU counted alone, and a form that runs out
    of open files leaves nothing behind for the next): its row, or why it failed."""
    command = [sys.executable, __file__, "--one", f"{n},{membership}", "--window", str(args.window),
               "--settle", str(args.settle),
               "--heartbeat", str(args.heartbeat), "--form-timeout", str(args.form_timeout),
               *(["--insecure"] if args.insecure else [])]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=args.form_timeout + args.settle + args.window + 120)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        row: dict[str, Any] = json.loads(lines[-1])
        return row
    errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
    why = "too many open files" if "Too many open files" in done.stderr else (errors[-1] if errors else "no row")
    return {"members": n, "membership": membership, "failed": why[:200]}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Messages and bytes per member per second against N, one line per membership form."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for membership in dict.fromkeys(r["membership"] for r in rows):
        mine = [r for r in rows if r["membership"] == membership and "failed" not in r]
        sizes = [r["members"] for r in mine]
        axes[0].plot(sizes, [r["messages_per_member_s"] for r in mine], "o-", label=membership)
        axes[1].plot(sizes, [r["bytes_per_member_s"] / 1e3 for r in mine], "o-", label=membership)
    axes[0].set(xlabel="members N", ylabel="messages / member / s", title="membership messages")
    axes[1].set(xlabel="members N", ylabel="kB / member / s", title="membership bytes")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,20,40,80", help="mesh sizes, comma-separated (default 10,20,40,80)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds counted once the mesh has formed")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds between the mesh forming and the count (the news of its joins told out)")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="the heartbeat period (the default's)")
    parser.add_argument("--membership", default="all,probe",
                        help="the membership forms to measure, comma-separated (default: all,probe)")
    parser.add_argument("--insecure", action="store_true", help="plain TCP (the default measures CURVE keys)")
    parser.add_argument("--form-timeout", type=float, default=120.0, help="seconds to wait for the mesh to form")
    parser.add_argument("--plot", type=Path, help="also draw messages and bytes per member against N here (PNG)")
    parser.add_argument("--json", type=Path, help="also write the figures here (what docs/ tables are drawn from)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # N,FORM: measure one in this process, print its row
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    if args.one:
        n, membership = args.one.split(",")
        print(json.dumps(asyncio.run(measure(int(n), membership, args.window, args.settle, args.heartbeat,
                                             args.insecure, args.form_timeout))))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    print(f"{'N':>5} {'membership':<11}{'formed s':>9}{'msgs/member/s':>15}{'bytes/member/s':>16}{'conns/member':>14}"
          f"{'open files':>12}{'CPU share':>11}")
    for n in sizes:
        for membership in args.membership.split(","):  # interleaved: each size measures every form in turn
            row = measure_apart(n, membership, args)
            rows.append(row)
            if "failed" in row:  # e.g. out of open files: what this form cannot do at this size, recorded
                print(f"{n:>5} {membership:<11} failed: {row['failed']}", flush=True)
                continue
            formed = f"{row['formed_s']:.1f}" if row["formed_s"] is not None else "never"
            print(f"{n:>5} {membership:<11}{formed:>9}{row['messages_per_member_s']:>15.1f}"
                  f"{row['bytes_per_member_s']:>16.0f}{row['connections_per_member']:>14.1f}{row['open_files']:>12}"
                  f"{row['cpu_share']:>11.2f}", flush=True)
    for membership in args.membership.split(","):
        mine = [r for r in rows if r["membership"] == membership and "failed" not in r]
        if not mine:
            continue
        base = mine[0]
        print(f"{membership}, against N={base['members']}: " + ", ".join(
            f"N={r['members']}: {r['messages_per_member_s'] / base['messages_per_member_s']:.1f}x messages, "
            f"{r['bytes_per_member_s'] / base['bytes_per_member_s']:.1f}x bytes" for r in mine[1:]))
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"heartbeat_s": args.heartbeat, "keys": not args.insecure,
                                         "window_s": args.window, "settle_s": args.settle, "sizes": rows},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
