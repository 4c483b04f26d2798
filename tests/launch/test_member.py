"""Launching members: a scenario's mesh settings reach every member, however it is started."""

from __future__ import annotations

from pathlib import Path

from p2pfed.config import NodeConfig
from p2pfed.launch.member import make_endpoint, use_scenario_mesh
from p2pfed.launch.runner import ProcessMesh, member
from p2pfed.net import security
from p2pfed.scenario.config import load_scenario

SCENARIO = """
[scenario]
name = "caps"
nodes = 2
rounds = 1
methods = ["fedavg-p2p"]
[data]
partition.clusters = 1
[mesh]
heartbeat = 0.2
dead_after = 9
max_message_mb = 8
"""


def test_a_scenarios_message_cap_and_timing_reach_every_member(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    scenario = load_scenario(path)
    # p2pfed run: every member of the scripted mesh (it was 1 GiB whatever the scenario said)
    endpoint = member(scenario, "fedavg-p2p", "n00", tmp_path)
    assert endpoint.transport.options.max_message_bytes == 8 << 20 and endpoint.transport.limits.max_message_bytes \
        == 8 << 20
    assert (endpoint.options.mesh, endpoint.options.heartbeat, endpoint.options.dead_after) == \
        ("caps-fedavg-p2p", 0.2, 9)
    # p2pfed node --scenario / p2pfed coordinator --scenario: the node's config takes the scenario's mesh
    # (its mesh name stays "default", a bootstrap's without --mesh: a README recipe's node was refused as a
    # member of mesh "caps-fedavg-p2p")
    cfg = NodeConfig(name="n00")
    use_scenario_mesh(cfg, scenario)
    endpoint = make_endpoint(cfg, "node")
    assert endpoint.transport.options.max_message_bytes == 8 << 20 and endpoint.options.mesh == "default"
    assert endpoint.options.heartbeat == 0.2 and endpoint.options.dead_after == 9
    cfg = NodeConfig(name="n00")
    cfg.mesh.mesh = "lab"  # a mesh named on the command line stays
    use_scenario_mesh(cfg, scenario)
    assert cfg.mesh.mesh == "lab" and cfg.mesh.max_message_mb == 8


def test_a_scripted_join_goes_through_the_live_node_it_names_else_the_bootstrap(tmp_path: Path) -> None:
    # [[events]] via = 1: in a run of one process per node, the joiner gets node 1's ticket from what the
    # bootstrap knows of it (its address and key); a node that is not alive is no way in
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    mesh = ProcessMesh(load_scenario(path), "fedavg-p2p", None, None, tmp_path)
    mesh.boot = member(mesh.scenario, "fedavg-p2p", "bootstrap", tmp_path, "bootstrap")
    key = security.ephemeral_keys().public
    mesh.boot.peers.heard_from("n01", "tcp://127.0.0.1:5555", "node", 1, key.decode(), 0, key=key.decode())
    assert mesh.entry(1) == security.ticket("tcp://127.0.0.1:5555", key) and "/" in mesh.entry(1)
    assert mesh.entry(0) == mesh.entry(-1) == mesh.boot.ticket  # n00 unknown; no via
    mesh.boot.peers.left("n01")
    assert mesh.entry(1) == mesh.boot.ticket
