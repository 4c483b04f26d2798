"""Launching members: a scenario's mesh settings reach every member, however it is started."""

from __future__ import annotations

from pathlib import Path

from p2pfed.config import NodeConfig
from p2pfed.launch.member import make_endpoint, use_scenario_mesh
from p2pfed.launch.runner import member
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
    cfg = NodeConfig(name="n00")
    use_scenario_mesh(cfg, scenario, "fedavg-p2p")
    endpoint = make_endpoint(cfg, "node")
    assert endpoint.transport.options.max_message_bytes == 8 << 20 and endpoint.options.mesh == "caps-fedavg-p2p"
    assert endpoint.options.heartbeat == 0.2 and endpoint.options.dead_after == 9
    cfg = NodeConfig(name="n00")
    cfg.mesh.mesh = "lab"  # a mesh named on the command line stays
    use_scenario_mesh(cfg, scenario, "fedavg-p2p")
    assert cfg.mesh.mesh == "lab" and cfg.mesh.max_message_mb == 8
