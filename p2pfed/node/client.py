"""A node under a coordinator: it answers the coordinator's tasks with its own data, and nothing else.

Tasks (methods/central.py) arrive as ``task`` messages from the member whose role is ``coordinator``
(and whose name is the one given with ``--coordinator``, if any); a task from anyone else is refused.
The method comes with the task, so a node needs no ``--method``: the mesh tells it. Each task runs in a
worker thread, one at a time, while the event loop keeps answering heartbeats.

- train: take the best-fitting candidate (several: lowest training loss), train it (or the node's own
  model when no candidate comes: a method that keeps models local), send it back. The node's model and
  what its method's node side keeps across rounds (ClientMethod.state) are checkpointed after.
- eval / finish: take the personalised model the coordinator chose (or pick among candidates), evaluate
  it on the node's test shard, record it, report the metrics. finish ends the node.
- compute: a method's own step that leaves the node's model as it is (e.g. statistics of the node's data,
  or a copy of a model trained on a batch): tensors back.
- note: a number for each name the task lists (e.g. a score of each model the task sends).
What a task does is the method's node side (methods/central.py: ClientMethod); this node knows no method.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from pathlib import Path

import torch

from p2pfed.learn.checkpoint import load_own, refuse_old, save_atomic
from p2pfed.learn.train import describe_device, state_of
from p2pfed.methods import make_client
from p2pfed.methods.central import ClientMethod, Task, Update, aux_of, pack, unpack
from p2pfed.net.endpoint import Endpoint
from p2pfed.net.membership import ALIVE, DEAD, LEFT, SUSPECT, Change
from p2pfed.net.waits import first_of
from p2pfed.node.conduct import Conduct
from p2pfed.node.local import LocalNode, NodeData
from p2pfed.scenario.config import Scenario
from p2pfed.wire import Message, WireError

log = logging.getLogger(__name__)

TASKS = ("train", "eval", "finish", "compute", "note")


def finite(x: float) -> float | None:
    """x, or None where JSON and msgpack consumers would choke on NaN."""
    return x if math.isfinite(x) else None


class CentralNode(LocalNode):
    """One node of a coordinated method: its shard, its model, and the answers to the coordinator."""

    def __init__(self, scenario: Scenario, given: NodeData, method: str | None, endpoint: Endpoint, out_dir: Path,
                 state_dir: Path | None = None, *, coordinator: str | None = None,
                 conduct: Conduct | None = None) -> None:
        super().__init__(scenario, given, method, endpoint, out_dir, state_dir, conduct=conduct)
        self.client: ClientMethod | None = make_client(method, self, scenario) if method else None
        self.coordinator = coordinator
        self.send_delay = 0.0  # a scripted slow link: seconds before every answer
        self.lock = asyncio.Lock()
        self.finished = asyncio.Event()
        self.final_recorded = False  # the finish task came (the coordinator may leave before finished is set)
        self.coordinator_left = asyncio.Event()
        self.method_state: dict[str, torch.Tensor] = {}  # a restored node side's state, until its method is known
        endpoint.serve({"task": self._on_task}, self._on_peer_change)

    # -- what a ClientMethod may use besides what every node offers (node/local.py) -----------------
    async def train_copy(self, start: dict[str, torch.Tensor], samples: int, epochs: int, lr: float
                         ) -> dict[str, torch.Tensor]:
        """LocalNode.train_copy as it leaves this node (its methods send such copies to the coordinator), through
        its conduct."""
        return self.conduct.outgoing(await super().train_copy(start, samples, epochs, lr), self.round_seed)

    # -- tasks -----------------------------------------------------------------------------------
    async def _check_sender(self, msg: Message) -> None:
        # A coordinator that has just learned of this node (through gossip) introduces itself with a
        # heartbeat as it sends its first task; give that heartbeat a few periods to arrive.
        deadline = time.monotonic() + 5 * self.endpoint.options.heartbeat
        while True:
            peer = self.endpoint.peers.peers.get(msg.sender)
            if peer is not None and peer.role == "coordinator" and peer.state in (ALIVE, SUSPECT):
                break
            if time.monotonic() >= deadline:
                raise WireError(f"{msg.sender} is not a live coordinator of this mesh")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.endpoint.changed.wait(), max(0.0, deadline - time.monotonic()))
        if self.coordinator and self.coordinator not in (peer.name, peer.address):
            raise WireError(f"{msg.sender} is not the coordinator this node was told to follow ({self.coordinator})")

    def _method_for(self, name: str) -> ClientMethod:
        if self.client is None:
            try:
                self.client = make_client(name, self, self.scenario)
            except ValueError as exc:
                raise WireError(str(exc)) from None
            self.method_name = name
            # from now on it advertises the recipe it trains, as a node told its method at start does
            self.endpoint.recipe = self.scenario.fingerprint(name, self.card.input_shape, self.card.num_classes,
                                                             self.card.task, self.card.vocabulary)
            self.client.restore(self.method_state)
            log.info("%s: training under %s (told by the coordinator)", self.name, name)
        elif name != self.method_name:
            raise WireError(f"this node runs {self.method_name}, the task is for {name}")
        return self.client

    async def _on_task(self, msg: Message) -> Message | None:
        await self._check_sender(msg)
        body = msg.body
        kind = body["kind"]
        if kind not in TASKS:
            raise WireError(f"unknown task {kind!r}")
        client = self._method_for(body["method"])
        task = Task(kind, unpack(msg.tensors, self.reference), client.instructions.read(body["meta"]), body["groups"],
                    body["names"], body["shared"], aux_of(msg.tensors))
        if task.shared > len(task.models):
            raise WireError("a task's shared count must be between 0 and its number of models")
        if task.groups and len(task.groups) != len(task.candidates):
            raise WireError("a task's groups must name one group per candidate model")
        async with self.lock:
            self.round = msg.round
            if self.send_delay:
                await asyncio.sleep(self.send_delay)
            if kind == "train":
                update, choice = await self.conduct.answer(self, client, task)
                self.record("train", train_loss=finite(update.train_loss), choice=choice)
                self.checkpoint()
                return self._update(update)
            if kind in ("eval", "finish"):
                return await self._evaluate(client, task, final=kind == "finish")
            if kind == "compute":  # a method's own step: tensors back, the node's model unchanged
                return self._update(await client.compute(task))
            # note: a number for each name the task lists (e.g. a score of each model it sends)
            values = await client.note(task)
            answer = [values[name] for name in task.names]
            return self.endpoint.message("note", {"kind": "answer", "names": task.names, "values": answer, "meta": {}})

    def _update(self, update: Update) -> Message:
        """An update as it travels: the node's sample count, the candidate trained, its loss, the models."""
        body = {"kind": "update", "samples": self.data.samples,
                "meta": {"choice": update.choice, "train_loss": finite(update.train_loss)}}
        states = [update.state, *update.extra] if update.state is not None else []
        return self.endpoint.message("model", body, pack(states, update.aux))

    async def _evaluate(self, client: ClientMethod, task: Task, final: bool) -> Message:
        ev, choice = await client.evaluate(task)
        cluster = task.groups[choice] if task.groups else -1
        metrics = {"accuracy": ev.accuracy, "loss": ev.loss, "macro_f1": ev.macro_f1}
        if task.instructions.validate and task.candidates:  # the model's accuracy on this node's validation
            # split too (a coordinator that tests the model it serves on a test set of its own picks its best
            # round by it)
            val = await self._evaluate_on(self.new_model(task.candidates[choice]), self.data.x_val, self.data.y_val)
            metrics["val_accuracy"] = val.accuracy
        if final:
            self.final_recorded = True
            self.record("final", **metrics, test_samples=ev.samples, cluster=cluster,
                        true_cluster=self.true_cluster_of(self.name), bytes_sent=self.endpoint.transport.bytes_sent,
                        device=describe_device(self.device))
            self.checkpoint()
            asyncio.get_running_loop().call_later(0.5, self.finished.set)  # after the reply has left
        else:
            self.record("round", **metrics, cluster=cluster, bytes_sent=self.endpoint.transport.bytes_sent)
        meta = {"choice": choice, **{k: finite(v) for k, v in metrics.items()}}
        return self.endpoint.message("control", {"kind": "metrics", "meta": meta})

    # -- life ------------------------------------------------------------------------------------
    def _on_peer_change(self, change: Change) -> None:
        peer = self.endpoint.peers.peers.get(change.name)
        if peer is not None and peer.role == "coordinator" and change.new == LEFT:
            self.coordinator_left.set()
        if peer is not None and peer.role == "coordinator" and change.new == DEAD:
            log.warning("%s: the coordinator %s is silent; waiting for it to come back", self.name, change.name)

    async def run(self, start_round: int = 0, wait_for_peers: int = 0) -> None:
        """Answer tasks until the coordinator sends finish (or leaves without one).

        start_round and wait_for_peers are the decentralized node's; here the coordinator decides both.
        """
        self.restore()
        await first_of(self.finished, self.coordinator_left)
        if not self.finished.is_set() and not self.final_recorded:
            log.warning("%s: the coordinator left before finishing the run", self.name)
        async with self.lock:  # let a task in progress end before the sockets close
            pass

    def checkpoint(self) -> None:
        """The node's own model, round and its method's node-side state (ClientMethod.state), atomically: a
        model or a method's tensors that never leave the node live only here."""
        method = self.client.state() if self.client is not None else self.method_state
        save_atomic({"round": self.round, "model": state_of(self.model), "method": method}, self.checkpoint_path,
                    self.card_metadata(self.round))

    def restore(self) -> None:
        refuse_old(self.checkpoint_path)
        if self.checkpoint_path.exists():
            ckpt = load_own(self.checkpoint_path)
            self.model.load_state_dict(ckpt["model"])
            self.round = int(ckpt["round"])
            self.method_state = dict(ckpt.get("method", {}))  # checkpoints from before it was kept have none
            if self.client is not None:
                self.client.restore(self.method_state)
            log.info("%s: resumed its model from round %d", self.name, self.round)
