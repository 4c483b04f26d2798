"""Launching members: a scenario's mesh settings reach every member, however it is started."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

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


def test_a_large_pfedlia_p2p_mesh_introduces_itself_lazily_unless_the_scenario_says_otherwise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # [mesh] introduce_up_to left at 0 is the method's: pFedLIA-p2p past all_pairs_up_to (100) members hears
    # directly from 64 (half the wall time at 1,000 nodes); every other method, and a small mesh, from every peer
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace("nodes = 2", "nodes = 101").replace("rounds = 1", "rounds = 8")
                    .replace('"fedavg-p2p"', '"pfedlia-p2p", "fedavg-p2p"'))
    large = load_scenario(path)
    small = load_scenario(path, ["scenario.nodes=100"])
    wider = load_scenario(path, ["methods.pfedlia-p2p.all_pairs_up_to=200"])
    for scenario, method, wanted in [(large, "pfedlia-p2p", 64), (small, "pfedlia-p2p", 1024),
                                     (wider, "pfedlia-p2p", 1024), (large, "fedavg-p2p", 1024)]:
        endpoint = member(scenario, method, "n00", tmp_path)  # p2pfed run
        assert (endpoint.options.introduce_up_to, endpoint.lazy) == (wanted, wanted < 1024), (method, scenario.nodes)
        cfg = NodeConfig(name="n00")
        use_scenario_mesh(cfg, scenario, method)  # p2pfed node --scenario --method
        assert make_endpoint(cfg, "node").options.introduce_up_to == wanted
    cfg = NodeConfig(name="bootstrap")
    use_scenario_mesh(cfg, large)  # a bootstrap runs no method: every peer
    assert make_endpoint(cfg, "bootstrap").options.introduce_up_to == 1024
    # the scenario's own value is every method's, and is said to cut short a method working with every live peer
    chosen = load_scenario(path, ["mesh.introduce_up_to=32"])
    with caplog.at_level(logging.WARNING):
        assert member(chosen, "pfedlia-p2p", "n00", tmp_path).options.introduce_up_to == 32
        assert member(chosen, "fedavg-p2p", "n00", tmp_path).options.introduce_up_to == 32
        assert not caplog.records  # building a member says nothing: the run says it once
        cfg = NodeConfig(name="n00")
        use_scenario_mesh(cfg, chosen, "fedavg-p2p")
        use_scenario_mesh(cfg, chosen, "pfedlia-p2p")
        # a lazy member counts the bootstrap among its live peers: 101 nodes may each hear from 101 members
        use_scenario_mesh(cfg, load_scenario(path, ["mesh.introduce_up_to=101"]), "fedavg-p2p")
        use_scenario_mesh(cfg, load_scenario(path, ["mesh.introduce_up_to=32", "mesh.membership='all'"]),
                          "fedavg-p2p")  # the eager form whatever K says
    assert [r.getMessage() for r in caplog.records] == [
        "fedavg-p2p: mesh.introduce_up_to = 32 is below the 101 members each node may hear from (its 100 peers and "
        "the bootstrap): a fedavg-p2p node works with the live peers it hears from, and it hears directly from "
        "about 32 (0 leaves it to the method)"]
