"""Methods by name. Decentralized methods (methods/base.py) run in every node's own round loop;
coordinated methods (methods/central.py) have a server side, run by the coordinator, and a node side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from p2pfed.config import ConfigError
from p2pfed.learn.datasets import task_of
from p2pfed.methods.base import Method, NodeContext, PeerContext
from p2pfed.methods.baselines import FedAvgPeer, FedAvgServer, LocalPeer, LocalServer, OraclePeer, OracleServer
from p2pfed.methods.cam import FeSEMCAMServer, IFCACAMServer
from p2pfed.methods.central import ClientMethod, ServerContext, ServerMethod
from p2pfed.methods.cfl import CFLServer
from p2pfed.methods.dpsgd import DPSGD
from p2pfed.methods.ensemble import FedAvgEnsembleServer, FedProxEnsembleServer
from p2pfed.methods.epidemic import Epidemic
from p2pfed.methods.fedavgm import FedAvgMServer
from p2pfed.methods.feddsmic import FedDSMICPaperServer, FedDSMICServer, FedDSPaperServer, FedDSServer
from p2pfed.methods.fedfm import FedFML2Server, FedFMLiteServer, FedFMServer
from p2pfed.methods.fedfomo import FedFomoServer
from p2pfed.methods.fedproto import FedProtoServer
from p2pfed.methods.fedprox import FedProxPeer, FedProxServer
from p2pfed.methods.fedprox_fm import FedProxFMServer
from p2pfed.methods.fesem import FeSEMServer
from p2pfed.methods.former import FORMER
from p2pfed.methods.gossip import Gossip
from p2pfed.methods.ifca import IFCAServer
from p2pfed.methods.options import MethodOptions, options_of
from p2pfed.methods.perfedavg import PerFedAvgServer
from p2pfed.methods.pfedlia.central import PFedLIACentralPaperServer, PFedLIACentralServer
from p2pfed.methods.pfedlia.p2p import PFedLIAP2P, PFedLIAP2PPaper
from p2pfed.methods.scaffold import ScaffoldServer
from p2pfed.scenario.config import Scenario, load_scenario, source

REGISTRY: dict[str, type[Method]] = {m.name: m for m in (
    LocalPeer, FedAvgPeer, OraclePeer, FedProxPeer, PFedLIAP2P, PFedLIAP2PPaper, DPSGD, Gossip, Epidemic)}
CENTRAL: dict[str, type[ServerMethod]] = {m.name: m for m in (
    FedAvgServer, FedProxServer, LocalServer, OracleServer, FeSEMServer, IFCAServer, CFLServer,
    PFedLIACentralServer, PFedLIACentralPaperServer, IFCACAMServer, FeSEMCAMServer, FedFomoServer, FedProtoServer,
    FedDSMICServer, FedDSServer, FedDSMICPaperServer, FedDSPaperServer, FedFMServer, FedFML2Server, FedFMLiteServer,
    PerFedAvgServer, FedAvgMServer, ScaffoldServer, FedAvgEnsembleServer, FedProxEnsembleServer, FedProxFMServer)}
METHODS = (*CENTRAL, *REGISTRY)
OPTIONS: dict[str, type[MethodOptions] | None] = {
    **{m: c.options_type for m, c in CENTRAL.items()}, **{m: c.options_type for m, c in REGISTRY.items()}}


def check_scenario(scenario: Scenario) -> None:
    """Raise ConfigError for what in a scenario the methods themselves rule out: an unknown method, a table
    of a method that has no options or of none at all, an option's value, and an option that does not fit the
    scenario (K above the number of nodes, a warm-up as long as the run) of a method that runs."""
    if not scenario.methods:
        raise ConfigError(f"scenario.methods must name at least one method; choose among {', '.join(METHODS)}")
    unknown = [m for m in scenario.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"scenario.methods: {', '.join(repr(m) for m in unknown)} not known; "
                          f"choose among {', '.join(METHODS)}")
    for name, table in scenario.method_tables.items():
        method: type[Method] | type[ServerMethod] | None = CENTRAL.get(name) or REGISTRY.get(name)
        if method is None:
            raise ConfigError(f"[methods.{name}]: {name!r} is not a known method; choose among {', '.join(METHODS)}")
        if method.options_type is None:
            if table:
                raise ConfigError(f"[methods.{name}]: {name} has no options")
        elif name not in scenario.methods:  # its values are checked, not how they fit a run it is not in
            options_of(method.options_type, scenario, name, fit=False)
    for name in scenario.methods:
        check_method(name, scenario, "scenario.methods")


def check_method(name: str, scenario: Scenario, where: str = "--method") -> None:
    """Raise ConfigError, naming where it came from, for a method that is not known or does not fit scenario
    (its task, its options): a member checks its --method before it joins, not when its first round starts."""
    method_class: type[Method] | type[ServerMethod] | None = CENTRAL.get(name) or REGISTRY.get(name)
    if method_class is None:
        raise ConfigError(f"{where}: {name!r} is not a known method; choose among {', '.join(METHODS)}")
    task = task_of(scenario.data.dataset)
    if method_class.tasks is not None and task not in method_class.tasks:
        raise ConfigError(f"{where}: {name} runs {', '.join(sorted(method_class.tasks))} only, not the "
                          f"{task} task of data.dataset {scenario.data.dataset!r}")
    method_class.options_from(scenario)  # errors name methods.NAME.KEY


def load_checked(path: Path, overrides: Sequence[str] = ()) -> Scenario:
    """A scenario file loaded (load_scenario: its tables and values) and checked against the methods: what a
    launcher runs. Errors name the file, as load_scenario's do."""
    scenario = load_scenario(path, overrides, FORMER)
    try:
        check_scenario(scenario)
    except ConfigError as exc:
        raise ConfigError(f"{source(path, overrides)}: {exc}") from None
    return scenario


def is_central(name: str) -> bool:
    """Whether a method needs a coordinator."""
    return name in CENTRAL


def introduce_up_to(name: str, scenario: Scenario) -> int:
    """[mesh] introduce_up_to for a member of method name's run: the scenario's, or, where it leaves it to the
    method (0), what the method asks for in a mesh of the scenario's size (0: every peer it hears of). A
    coordinated method's members introduce themselves to every peer: its clients work with the coordinator
    alone, but nothing measured says how they fare lazy."""
    return scenario.mesh.introduce_up_to or _wanted_by(name, scenario)


def introduce_warning(name: str, scenario: Scenario) -> str:
    """What the scenario's [mesh] introduce_up_to costs method name's run when the method works with every live
    peer and K is below the members each node may hear from (its peers and the bootstrap, which a lazy member
    counts among its live ones): a line for the run's log ('' when it costs nothing)."""
    wanted, others = scenario.mesh.introduce_up_to, scenario.nodes  # the nodes' other members: peers, bootstrap
    if name not in REGISTRY or scenario.mesh.membership != "probe" or not 0 < wanted < others or \
            _wanted_by(name, scenario):
        return ""
    return (f"{name}: mesh.introduce_up_to = {wanted} is below the {others} members each node may hear from (its "
            f"{others - 1} peers and the bootstrap): a {name} node works with the live peers it hears from, and it "
            f"hears directly from about {wanted} (0 leaves it to the method)")


def _wanted_by(name: str, scenario: Scenario) -> int:
    """The K a decentralized method asks for in a mesh of the scenario's size (0: every peer; a coordinated
    method: 0)."""
    method = REGISTRY.get(name)
    return method.introduce_up_to(method.options_from(scenario), scenario.nodes) if method is not None else 0


def make_method(name: str, node: PeerContext, scenario: Scenario) -> Method:
    """Instantiate a decentralized method by name for a node, with its options from the scenario."""
    if name not in REGISTRY:
        raise ValueError(f"unknown decentralized method {name!r}; choose one of {', '.join(REGISTRY)}")
    method = REGISTRY[name]
    return method(node, method.options_from(scenario))


def make_server(name: str, ctx: ServerContext, scenario: Scenario) -> ServerMethod:
    """Instantiate the server side of a coordinated method, with its options from the scenario."""
    if name not in CENTRAL:
        raise ValueError(f"unknown coordinated method {name!r}; choose one of {', '.join(CENTRAL)}")
    method = CENTRAL[name]
    return method(ctx, method.options_from(scenario))


def make_client(name: str, node: NodeContext, scenario: Scenario) -> ClientMethod:
    """Instantiate the node side of a coordinated method, with its options from the scenario."""
    if name not in CENTRAL:
        raise ValueError(f"unknown coordinated method {name!r}; choose one of {', '.join(CENTRAL)}")
    # The base ClientMethod covers every method whose local step is plain SGD with an optional penalty.
    method = CENTRAL[name]
    return (method.client or ClientMethod)(node, method.options_from(scenario))
