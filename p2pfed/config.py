"""Configuration: dataclasses filled from TOML and validated in one place, defaults in one place.

An error names the file and the dotted key, e.g. ``node.toml: mesh.heartbeat must be > 0 (got -1)``.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from p2pfed.net.endpoint import MeshOptions
    from p2pfed.net.transport import TransportOptions

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the file and the key."""


@dataclass
class MeshConfig:
    """How a member finds and watches the mesh."""

    mesh: str = "default"  # the mesh's name: members of other meshes are refused
    heartbeat: float = 1.0  # seconds between a member's heartbeats
    suspect_after: float = 3.0  # heartbeat periods of silence before a peer is suspect
    dead_after: float = 6.0  # heartbeat periods of silence before a peer is dead (a round stops waiting for it)
    request_timeout: float = 30.0  # seconds a sender waits for a model's acknowledgement
    max_message_mb: int = 1024  # the largest message a member accepts (MB); a larger one closes its connection
    join_give_up: float = 300.0  # seconds without an answer to its hellos before a member stops trying
    insecure: bool = False  # plain TCP, names trusted on their word (every member must agree): trusted networks only
    # "probe": heartbeat the peers worked with and probe one other a period (messages flat in the mesh's size);
    # "all": heartbeat every peer and gossip the whole table each period (what members did before "probe"). Every
    # member of a mesh must use the same: a member of the other form is refused, naming both
    membership: str = "probe"
    # "probe": a member pings the peers it hears of while it has fewer live peers than this (and pings on their
    # way); past it, a peer heard of is introduced when first worked with (a request pings it first) or when it
    # reaches out itself: forming a mesh of N costs N * introduce_up_to pings, not N²/2 (docs/design.md, "Lazy
    # introduction"). 0, the default, leaves it to the method of a scenario's run: pFedLIA-p2p past all_pairs_up_to
    # members takes 64 (half the time at 1,000 nodes, docs/performance.md); every other method, and a member
    # started without a scenario's method (an own-data node among them), introduces every peer it hears of (the
    # largest table), as a method working with every live peer (FedAvg peer to peer, pFedLIA-p2p up to
    # all_pairs_up_to) needs
    introduce_up_to: int = 0

    def endpoint_options(self) -> tuple[MeshOptions, TransportOptions]:
        """The options of an endpoint of this mesh: its membership timing and its transport's message cap."""
        from p2pfed.net.endpoint import MeshOptions
        from p2pfed.net.transport import TransportOptions

        return (MeshOptions(mesh=self.mesh, heartbeat=self.heartbeat, suspect_after=self.suspect_after,
                            dead_after=self.dead_after, request_timeout=self.request_timeout,
                            join_give_up=self.join_give_up, insecure=self.insecure, membership=self.membership,
                            introduce_up_to=self.introduce_up_to or MeshOptions.max_peers),
                TransportOptions(max_message_bytes=self.max_message_mb << 20))

    def validate(self, where: str) -> None:
        """Raise ConfigError for values that cannot work."""
        from p2pfed.wire.messages import MAX_HEARTBEAT, MEMBERSHIP_FORMS, MIN_HEARTBEAT, is_name

        if not MIN_HEARTBEAT <= self.heartbeat <= MAX_HEARTBEAT:  # what every member accepts from a peer
            raise ConfigError(f"{where}heartbeat must be in [{MIN_HEARTBEAT:g}, {MAX_HEARTBEAT:g}] seconds "
                              f"(got {self.heartbeat})")
        _positive(where, "request_timeout", self.request_timeout)
        _positive(where, "max_message_mb", self.max_message_mb)
        _positive(where, "join_give_up", self.join_give_up)
        if not 1 <= self.suspect_after < self.dead_after:
            raise ConfigError(f"{where}suspect_after must be >= 1 and < dead_after (heartbeat periods)")
        from p2pfed.net.endpoint import MeshOptions

        if not 0 <= self.introduce_up_to <= MeshOptions.max_peers:  # (the table's size)
            raise ConfigError(f"{where}introduce_up_to must be in [1, {MeshOptions.max_peers}] live peers, or 0 to "
                              f"leave it to the method (got {self.introduce_up_to})")
        if self.membership not in MEMBERSHIP_FORMS:
            raise ConfigError(f"{where}membership must be one of {', '.join(repr(m) for m in MEMBERSHIP_FORMS)} "
                              f"(got {self.membership!r})")
        if not is_name(self.mesh):
            raise ConfigError(f"{where}mesh must be a name of up to 64 letters, digits, '-', '_' or '.' "
                              f"(got {self.mesh!r})")


@dataclass
class NodeConfig:
    """One member of a mesh: where it listens, how it joins, how it is secured."""

    name: str = ""
    bind: str = "tcp://0.0.0.0:0"
    advertise: str = ""
    join: list[str] = field(default_factory=list)
    keys: str = ""
    join_key: str = "bootstrap"
    discovery: str = ""
    state_dir: str = ""
    mesh: MeshConfig = field(default_factory=MeshConfig)

    def validate(self, where: str) -> None:
        """Raise ConfigError for values that cannot work."""
        from p2pfed.wire.messages import check_address, is_name

        if not self.bind.startswith("tcp://") or ":" not in self.bind[len("tcp://"):]:
            raise ConfigError(f"{where}bind must be tcp://IP:PORT (port 0 or * picks one; got {self.bind!r})")
        from p2pfed.net.security import BadKey, split_ticket

        for key, value in [("advertise", self.advertise), *[("join", j) for j in self.join]]:
            try:  # a join may be a ticket, tcp://HOST:PORT/KEY: its address is checked, and its key
                address = split_ticket(value)[0] if key == "join" else value
            except BadKey as exc:
                raise ConfigError(f"{where}{key}: {exc}") from None
            problem = check_address(address) if value else ""
            if problem:  # what peers would refuse, said now
                raise ConfigError(f"{where}{key} {problem} (got {value!r})")
        if self.discovery and not self.discovery.startswith("mqtt://"):
            raise ConfigError(f"{where}discovery must be mqtt://BROKER:PORT/MESH (got {self.discovery!r})")
        if self.name and not is_name(self.name):
            raise ConfigError(f"{where}name must be up to 64 letters, digits, '-', '_' or '.' (got {self.name!r})")
        self.mesh.validate(f"{where}mesh.")


def _positive(where: str, key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{where}{key} must be > 0 (got {value})")


def fill(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass cls from a TOML table, checking every key and type; nested tables fill nested fields."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'} must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where}{sorted(unknown)[0]} is not a known key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _coerce(hints[key], value, f"{where}{key}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return fill(typing.cast(type, hint), value, where + ".")
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(options[0], value, where)
    if origin in (list, tuple):  # a tuple field is tuple[T, ...]: a list in TOML, kept immutable
        args = typing.get_args(hint)
        assert origin is list or args[1:] == (Ellipsis,), f"{where}: only tuple[T, ...] fields can be filled"
        item = args[0]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list")
        items = [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table")
        return dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any:
        return value
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{where} must be {hint.__name__} (got {type(value).__name__} {value!r})")
    return value


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; a syntax error names the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_node_config(path: Path | None, section: str = "node") -> NodeConfig:
    """Load the [node] (or [bootstrap], [coordinator]) table of a TOML file; no file gives the defaults."""
    if path is None:
        return NodeConfig()
    data = read_toml(path)
    unknown = set(data) - {section}
    if unknown:
        raise ConfigError(f"{path}: unknown table [{sorted(unknown)[0]}] (expected [{section}])")
    try:
        cfg = fill(NodeConfig, data.get(section, {}), f"{section}.")
        cfg.validate(f"{section}.")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return cfg
