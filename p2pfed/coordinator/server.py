"""The optional coordinator: a member of the mesh (same transport, membership and keys as any node) that
plays the server for the coordinated methods (methods/central.py).

One round, top to bottom (``run_round``): the method's pre-round work → the participants get their train
tasks and have until the deadline to answer → the method aggregates what came back in time → every
eval_every rounds every live node evaluates its personalised model → the cluster sizes are recorded →
the state is checkpointed. A node that dies is simply not heard from by the deadline; a node that joins
is placed by the method's rule at the next round. After the last round every node gets its final
personalised model (a finish task) and ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from p2pfed.learn.checkpoint import SUFFIX, load_own, refuse_old, save_atomic
from p2pfed.learn.held import ServerData
from p2pfed.learn.models import build_model
from p2pfed.learn.train import evaluate, pick_device, state_of
from p2pfed.methods import make_server
from p2pfed.methods.central import Task, Update, aux_of, pack, unpack
from p2pfed.net.endpoint import Endpoint
from p2pfed.net.progress import Progress
from p2pfed.net.transport import DeliveryError
from p2pfed.report.records import append_record
from p2pfed.scenario.config import Scenario
from p2pfed.wire import Message, WireError
from p2pfed.wire.messages import clip

log = logging.getLogger(__name__)


class Coordinator:
    """The server of one coordinated method over the mesh its endpoint belongs to."""

    def __init__(self, scenario: Scenario, method: str, endpoint: Endpoint, data: ServerData,
                 truth: dict[str, int], out_dir: Path, state_dir: Path | None = None) -> None:
        """data: what it holds of the data itself (its launcher draws it, learn/held.py); truth: each node's true
        cluster where the scenario knows it (for the record, and for a method that is told them)."""
        self.scenario = scenario
        self.method_name = method
        self.endpoint = endpoint
        self.cfg = scenario.train
        self.seed = scenario.seed
        self.fraction = self.cfg.participation
        self.clusters_hint = scenario.data.clusters
        self.data = data
        self._template: nn.Module | None = None
        self.initial = self.build(scenario.seed)  # the seeded initial model every node also builds
        self.true = dict(truth)
        self.method = make_server(method, self, scenario)
        self.round = 0
        self.tested = -1  # the round whose served model was last tested on the server's set (-1: none yet)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = out_dir / "coordinator.jsonl"
        self.checkpoint_path = (state_dir or out_dir) / f"coordinator{SUFFIX}"
        # its status tells its grouping of the nodes (p2pfed dashboard)
        endpoint.serve(progress=Progress(method, groups=lambda: self.method.clusters()).body)

    # -- what a server-side method may use (methods/central.py: ServerContext) -------------------
    def build(self, seed: int) -> dict[str, torch.Tensor]:
        """A freshly initialised model of the scenario's architecture."""
        return state_of(build_model(self.cfg.model, self.data.input_shape, self.data.num_classes, seed=seed))

    def true_cluster_of(self, name: str) -> int:
        return self.true.get(name, -1)

    def module(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The scenario's architecture with state loaded (for server-side inference)."""
        if self._template is None:  # one instance, reloaded: server-side inference runs one call at a time
            self._template = build_model(self.cfg.model, self.data.input_shape, self.data.num_classes, seed=self.seed)
        self._template.load_state_dict(state)
        return self._template.eval()

    async def ask(self, nodes: list[str], tasks: dict[str, Task], timeout: float | None = None) -> dict[str, Any]:
        """Send each node its task and wait (until the deadline) for the answers; drop what is invalid."""
        deadline = timeout or self.cfg.round_timeout

        async def one(node: str) -> tuple[str, Any]:
            task = tasks[node]
            body = {"kind": task.kind, "method": self.method_name, "groups": task.groups, "names": task.names,
                    "shared": task.shared, "meta": task.instructions.wire()}
            msg = self.endpoint.message("task", body, pack(task.models, task.aux))
            try:
                # The request fails at once if the mesh declares the node dead or gone meanwhile.
                return node, self._read(task, await self.endpoint.request(node, msg, deadline))
            except (DeliveryError, WireError) as exc:
                log.warning("coordinator: round %d: %s from %s: %s", self.round, task.kind, node, exc)
                return node, None

        answers = await asyncio.gather(*(one(n) for n in nodes))
        return {n: a for n, a in answers if a is not None}

    def _read(self, task: Task, reply: Message) -> Any:
        """A node's answer to a task, validated: an Update, a note's numbers by name, or evaluation metrics."""
        if task.kind in ("train", "compute"):
            if reply.type != "model" or reply.body["kind"] != "update" or reply.body["samples"] <= 0:
                raise WireError(f"expected an update, got {reply.type} {reply.body.get('kind', '')}")
            states = unpack(reply.tensors, self.initial)
            meta = reply.body["meta"]
            choice, loss = meta.get("choice", 0), meta.get("train_loss")
            if not isinstance(choice, int) or not 0 <= choice < max(1, len(task.candidates)):
                raise WireError(f"choice {clip(choice, 40)} is not one of the {len(task.candidates)} candidates")
            return Update(states[0] if states else None, reply.body["samples"], choice,
                          float(loss) if isinstance(loss, (int, float)) else math.nan, states[1:],
                          aux_of(reply.tensors))
        if task.kind == "note":
            values = reply.body.get("values", [])
            if (reply.type != "note" or reply.body["kind"] != "answer" or reply.body["names"] != task.names
                    or len(values) != len(task.names) or not all(math.isfinite(v) for v in values)):
                raise WireError("expected one finite number per name of the note task, in the order sent")
            return dict(zip(reply.body["names"], values, strict=True))
        if reply.type != "control" or reply.body["kind"] != "metrics":
            raise WireError(f"expected metrics, got {reply.type}")
        return reply.body["meta"]

    def live_nodes(self) -> list[str]:
        """Learning nodes that are alive or suspect."""
        return self.endpoint.peers.live_names("node")

    # -- the round loop --------------------------------------------------------------------------
    async def run(self, wait_for: int = 0, start_timeout: float = 120.0) -> None:
        """Run the scenario's rounds (resuming from a checkpoint), then hand every node its final model."""
        start = self.restore()
        deadline = time.monotonic() + start_timeout
        while len(self.live_nodes()) < wait_for and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        log.info("coordinator: %s with %d nodes from round %d", self.method_name, len(self.live_nodes()), start)
        for rnd in range(start, self.scenario.rounds):
            await self.run_round(rnd)
        done = await self.evaluate("finish")
        late = [n for n in self.live_nodes() if n not in done]
        if late:  # a node still busy with a late task: one more try, with a longer deadline
            log.info("coordinator: finish again for %s", ", ".join(late))
            await self.evaluate("finish", only=late, timeout=3 * self.cfg.round_timeout)
        self.record("final", assignment=self.method.clusters(), sizes=self.sizes(),
                    bytes_sent=self.endpoint.transport.bytes_sent)

    async def run_round(self, rnd: int) -> None:
        """One round: pre-round work, train tasks, aggregate, evaluate, record, checkpoint."""
        self.round = self.endpoint.round = rnd
        t0 = time.monotonic()
        await self.method.before_round(rnd, self.live_nodes())
        participants = self.method.participants(rnd, self.live_nodes())
        tasks = {n: self.method.train_task(rnd, n) for n in participants}
        replies = await self.ask(participants, tasks)
        updates: dict[str, Update] = {}
        for node, up in replies.items():
            if tasks[node].groups:
                self.method.place(node, tasks[node].groups[up.choice])
            updates[node] = up
        self.method.aggregate(rnd, updates)
        if (rnd + 1) % self.cfg.eval_every == 0:
            await self.evaluate("eval")
        self.record("round", participants=len(participants), updates=len(updates), sizes=self.sizes(),
                    assignment=self.method.clusters(), seconds=time.monotonic() - t0)
        self.checkpoint(rnd)

    async def evaluate(self, kind: str, only: list[str] | None = None, timeout: float | None = None) -> set[str]:
        """Every live node (or those in only) evaluates (eval) or takes (finish) its personalised model;
        return the nodes that answered."""
        nodes = [n for n in self.live_nodes() if only is None or n in only]
        # the finish after an evaluation round would test the same served model again: its record is there
        again = kind == "finish" and self.tested == self.round
        served = self.method.served_model() if self.data.test is not None and only is None and not again else None
        tasks = {}
        for n in nodes:
            task = self.method.eval_task(n)
            how = replace(task.instructions, validate=True) if served is not None else task.instructions
            tasks[n] = Task(kind, task.models, how, task.groups, task.names, task.shared, task.aux)
        answers = await self.ask(nodes, tasks, timeout)
        accuracies, validated = [], []
        for node, meta in answers.items():
            choice = meta.get("choice", 0)
            if tasks[node].groups and isinstance(choice, int) and 0 <= choice < len(tasks[node].groups):
                self.method.place(node, tasks[node].groups[choice])
            if isinstance(meta.get("accuracy"), float):
                accuracies.append(meta["accuracy"])
            val = meta.get("val_accuracy")
            if isinstance(val, float) and 0.0 <= val <= 1.0:  # a node's word, bounded: nan and junk left out
                validated.append(val)
        if accuracies:
            log.info("coordinator: round %d: %s of %d nodes, mean accuracy %.4f", self.round, kind, len(accuracies),
                     sum(accuracies) / len(accuracies))
        if served is not None and self.data.test is not None:
            await self.test_served(served, self.data.test, validated)
        return set(answers)

    async def test_served(self, served: dict[str, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                          validated: list[float]) -> None:
        """The served model's accuracy on the test set the coordinator holds, recorded with the nodes' mean
        validation accuracy of the same model, by which the report picks the best round."""
        x, y = test
        module = build_model(self.cfg.model, self.data.input_shape, self.data.num_classes, seed=self.seed)
        module.load_state_dict(served)  # its own instance: the test runs in a thread while the loop goes on
        ev = await asyncio.to_thread(evaluate, module, x, y, pick_device(self.cfg.device), task=self.data.task)
        val = sum(validated) / len(validated) if validated else None
        self.record("server", val_accuracy=val, validated=len(validated), accuracy=ev.accuracy, loss=ev.loss,
                    macro_f1=ev.macro_f1, test_samples=ev.samples)
        self.tested = self.round
        log.info("coordinator: round %d: served model %.4f on %d server test samples (nodes' validation %s)",
                 self.round, ev.accuracy, ev.samples, "–" if val is None else f"{val:.4f}")

    def sizes(self) -> list[int]:
        """Cluster sizes, largest first (nodes not placed yet are left out)."""
        counts = Counter(g for g in self.method.clusters().values() if g >= 0)
        return sorted(counts.values(), reverse=True)

    def record(self, event: str, **fields: Any) -> None:
        append_record(self.metrics_path, event, "coordinator", self.method_name, self.round, **fields)

    # -- crash safety ----------------------------------------------------------------------------
    def checkpoint(self, rnd: int) -> None:
        """Models, assignments and round, atomically: a restarted coordinator resumes at rnd + 1."""
        data, models = self.method.state()
        save_atomic({"round": rnd, "method": self.method_name, "data": json.dumps(data), "models": models},
                    self.checkpoint_path)

    def restore(self) -> int:
        """Load the checkpoint if there is one; return the round to start from."""
        refuse_old(self.checkpoint_path)
        if not self.checkpoint_path.exists():
            return 0
        ckpt = load_own(self.checkpoint_path)
        if ckpt["method"] != self.method_name:
            raise ValueError(f"{self.checkpoint_path} is a checkpoint of {ckpt['method']}, not {self.method_name}")
        self.method.restore(json.loads(ckpt["data"]), ckpt["models"])
        log.info("coordinator: resumed %s from its checkpoint after round %d", self.method_name, ckpt["round"])
        return int(ckpt["round"]) + 1
