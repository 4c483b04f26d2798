"""CURVE key pairs: every member has one, and every connection is encrypted and authenticated with it.

Two kinds of mesh:
- **Open** (the default): any key may connect, and a name is bound to the key that first spoke for it
  (trust on first use, net/membership.py), so nobody else can speak for that name afterwards. A member's
  key pair is made on its first start and kept in its key folder (``~/.p2pfed/keys/NAME.key_secret``, or
  ``--keys DIR``), so a restarted member is still itself.
- **Closed**: a key folder with an allow-list, ``allowed/NAME.key`` being the key of the member called NAME
  and the only key that may speak for NAME; keys not in it are refused at the handshake
  (``p2pfed keys generate DIR --name NAME`` writes both).

A member's public key travels with its address: a *ticket* ``tcp://HOST:PORT/KEY`` (KEY in hex, safe in a
shell) is what a joiner needs to reach it, since CURVE dials only a server whose key it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.base import Authenticator
from zmq.utils import z85

log = logging.getLogger(__name__)

ALLOWED_DIR = "allowed"
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


class BadKey(ValueError):
    """A key, key file or ticket that cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class Keys:
    """A member's own CURVE key pair (z85 bytes) and, for a closed mesh, the public keys it accepts by name."""

    public: bytes
    secret: bytes
    allowed_dir: Path | None = None  # None: an open mesh (any key connects; names are bound on first use)
    allowed: frozenset[bytes] | None = None
    names: dict[str, bytes] = field(default_factory=dict)  # member name (key file name) -> its public key
    home: Path | None = None  # the folder of this machine's key pairs by name (other members' public keys too)

    @property
    def closed(self) -> bool:
        """True for a closed mesh (an allow-list); False for an open one (trust on first use)."""
        return self.allowed is not None

    def key_of(self, name: str) -> bytes | None:
        """The public key that may speak for member name, None if name is not in the allow-list."""
        return self.names.get(name)

    def server_key_for(self, name: str) -> bytes | None:
        """Public key of a member by its key file's name (e.g. 'bootstrap'): in the allow-list, else in this
        machine's key folder (a member started here); None if neither has it."""
        for folder in (self.allowed_dir, self.home):
            path = folder / f"{name}.key" if folder is not None else None
            if path is not None and path.is_file():
                return zmq.auth.load_certificate(str(path))[0]
        return None


def ephemeral_keys() -> Keys:
    """A key pair for this process only (a status query, a dashboard, a test member): an open mesh's member
    whose name never needs to outlive the process."""
    public, secret = zmq.curve_keypair()
    return Keys(public=public, secret=secret)


def default_key_home() -> Path:
    """Where a member keeps its key pair when no --keys is given: $P2PFED_HOME/keys, else ~/.p2pfed/keys."""
    return Path(os.environ.get("P2PFED_HOME") or Path.home() / ".p2pfed") / "keys"


def member_keys(folder: Path, name: str) -> Keys:
    """The keys of member name from folder: a closed mesh's key folder (one NAME.key_secret and allowed/, as
    ``p2pfed keys generate`` writes) as it is; otherwise folder/NAME.key_secret, made on first use (an open
    mesh), so that a restarted member keeps the key its name is bound to."""
    if (folder / ALLOWED_DIR).is_dir() and len(list(folder.glob("*.key_secret"))) == 1:
        return load_keys(folder)
    secret_path = folder / f"{name}.key_secret"
    if not secret_path.exists():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Made in a private folder and renamed into place: the secret is never readable by others, and two
        # processes starting the same member at once end with one key pair, not a mix of two.
        with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}-") as tmp:
            os.chmod(tmp, 0o700)
            public_tmp, secret_tmp = zmq.auth.create_certificates(tmp, name)
            os.chmod(secret_tmp, 0o600)
            os.replace(public_tmp, folder / f"{name}.key")
            os.replace(secret_tmp, secret_path)
        log.info("%s: made its key pair in %s (keep it: the mesh knows %s by it)", name, folder, name)
    try:
        public, secret = zmq.auth.load_certificate(str(secret_path))
    except (OSError, ValueError) as exc:
        raise BadKey(f"{secret_path}: not a key pair ({exc}); move it away to make a new one (the mesh "
                        f"will then know this member only under another name)") from None
    if secret is None:
        raise BadKey(f"{secret_path}: no secret key in file")
    return Keys(public=public, secret=secret, home=folder)


def parse_key(text: str) -> bytes | None:
    """A public key written as 64 hex digits or 40 z85 characters, as z85 bytes; None if text is neither."""
    if _HEX_KEY.fullmatch(text):
        return z85.encode(bytes.fromhex(text))
    if len(text) == 40 and all(c in _Z85 for c in text):
        return text.encode()
    return None


def hex_key(public: bytes) -> str:
    """A z85 public key as 64 hex digits: how tickets carry it (no character a shell would interpret)."""
    return z85.decode(public).hex()


def ticket(address: str, public: bytes | None) -> str:
    """What a joiner needs to reach the member at address: tcp://HOST:PORT/KEY, or the address alone for a
    member without keys (--insecure)."""
    return f"{address}/{hex_key(public)}" if public else address


def missing_key(address: str, doing: str = "joining through") -> str:
    """What a user is told when the member at address cannot be reached for want of its public key."""
    return (f"{doing} {address} needs the public key of the member there: pass its ticket, --join {address}/KEY, "
            "as that member prints it at its start (or --join-key KEY, FILE, or the name of a member started on "
            "this machine; or --insecure on every member, for a network where every host is trusted)")


def split_ticket(value: str) -> tuple[str, bytes | None]:
    """(address, public key or None) of a ticket tcp://HOST:PORT/KEY or of a plain address. Raise BadKey
    for a key part that is not a key."""
    scheme, sep, rest = value.partition("://")
    host_port, slash, key = rest.partition("/")
    if not sep or not slash:
        return value, None
    public = parse_key(key)
    if public is None:
        raise BadKey(f"{value[:120]!r}: the part after the port must be the member's public key (64 hex "
                        "digits, as the member prints at its start and p2pfed mesh status lists)")
    return f"{scheme}://{host_port}", public


def resolve_key(spec: str, keys: Keys | None) -> bytes | None:
    """A public key given as a key (hex or z85), a key file, or the name of a member whose key file is in the
    allow-list or this machine's key folder; None if spec is none of these."""
    public = parse_key(spec)
    if public is not None:
        return public
    path = Path(spec).expanduser()
    if path.suffix == ".key" and path.is_file():
        return zmq.auth.load_certificate(str(path))[0]
    return keys.server_key_for(spec) if keys is not None else None


def generate_keys(directory: Path, name: str = "node") -> tuple[Path, Path]:
    """Write a CURVE key pair NAME.key (public) and NAME.key_secret into directory; return both paths.

    The public key is also copied into DIRECTORY/allowed/, the allow-list folder this key pair uses by
    default; to build a mesh, copy every member's NAME.key into every member's allowed/ folder.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / f"{name}.key_secret").exists():
        raise FileExistsError(f"{directory / (name + '.key_secret')} exists; refusing to overwrite a secret key")
    public, secret = zmq.auth.create_certificates(str(directory), name)
    (directory / f"{name}.key_secret").chmod(0o600)
    allowed = directory / ALLOWED_DIR
    allowed.mkdir(exist_ok=True)
    (allowed / f"{name}.key").write_bytes(Path(public).read_bytes())
    return Path(public), Path(secret)


def load_keys(directory: Path, allowed_dir: Path | None = None) -> Keys:
    """Load the single NAME.key_secret of directory and the public keys of its allow-list folder."""
    secrets = sorted(directory.glob("*.key_secret"))
    if len(secrets) != 1:
        raise ValueError(
            f"{directory}: expected exactly one *.key_secret file, found {len(secrets)} "
            "(make one with: p2pfed keys generate DIR)"
        )
    public, secret = zmq.auth.load_certificate(str(secrets[0]))
    if secret is None:
        raise ValueError(f"{secrets[0]}: no secret key in file")
    allowed_dir = allowed_dir or directory / ALLOWED_DIR
    if not allowed_dir.is_dir():
        raise ValueError(f"{allowed_dir}: allow-list folder of peers' public keys not found")
    names: dict[str, bytes] = {}
    for path in sorted(allowed_dir.glob("*.key")):
        key = zmq.auth.load_certificate(str(path))[0]
        other = next((n for n, k in names.items() if k == key), None)
        if other is not None:
            raise ValueError(f"{allowed_dir}: {other}.key and {path.name} hold the same public key; a key may "
                             "speak for one name only")
        names[path.stem] = key
    if public not in names.values():
        log.warning("own public key is not in %s; peers with the same allow-list will refuse this node",
                    allowed_dir)
    return Keys(public=public, secret=secret, allowed_dir=allowed_dir, allowed=frozenset(names.values()),
                names=names, home=directory)


def own_name(keys: Keys) -> str | None:
    """The member name this node's own key is allowed as (its key file's name), if it is in the allow-list."""
    return next((n for n, k in keys.names.items() if k == keys.public), None)


class ZapHandler(Authenticator):
    """pyzmq's ZAP authenticator served by a task that ``aclose`` cancels and awaits before closing its socket.
    pyzmq's asyncio authenticator leaves its poll's file-descriptor reader to be removed after its socket is
    closed; a socket opened meanwhile with the same descriptor (the next member's, in this process) lost its
    reader, and that member's CURVE handshakes then never completed (nobody could reach a restarted member)."""

    task: asyncio.Task[None] | None = None
    poller: zmq.asyncio.Poller | None = None

    def start(self) -> None:
        super().start()
        self.poller = zmq.asyncio.Poller()
        self.poller.register(self.zap_socket, zmq.POLLIN)
        self.task = asyncio.get_running_loop().create_task(self._serve(), name="zap")

    async def _serve(self) -> None:
        assert self.poller is not None
        while True:
            events = dict(await self.poller.poll())
            if self.zap_socket in events:
                await self.handle_zap_message(self.zap_socket.recv_multipart())

    async def aclose(self) -> None:
        """Stop serving, let the poll's cleanup run, then close the ZAP socket."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            await asyncio.sleep(0)  # the poll's own done-callbacks (removing its reader) run now
        if self.poller is not None and self.zap_socket is not None:
            self.poller.unregister(self.zap_socket)
        self.stop()


def start_authenticator(ctx: zmq.asyncio.Context, keys: Keys) -> ZapHandler:
    """Start a ZAP handler on ctx that admits only CURVE clients whose public key is allowed (a closed mesh),
    or any CURVE client (an open mesh: the handler still tags each message with its sender's key, which the
    member checks against the name's bound key)."""
    auth = ZapHandler(ctx)
    auth.start()
    if keys.allowed is None:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    else:
        auth.configure_curve_callback(domain="*", credentials_provider=_AllowList(keys.allowed))
    return auth


class _AllowList:
    """ZAP credentials check that says, in one log line, which key it refused."""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self.allowed = allowed
        self.last_logged: dict[bytes, float] = {}

    def callback(self, domain: str, client_key: bytes) -> bool:
        """Admit allowed keys; log a refused key at most once a minute (it reconnects often)."""
        if client_key in self.allowed:
            return True
        now = time.monotonic()
        if now - self.last_logged.get(client_key, -60.0) >= 60.0:
            self.last_logged[client_key] = now
            log.warning("refused a connection: public key %s is not in the allow-list", client_key.decode())
        return False


def make_server(sock: zmq.Socket, keys: Keys) -> None:
    """Make sock a CURVE server with the node's key pair."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def make_client(sock: zmq.Socket, keys: Keys, server_key: bytes) -> None:
    """Make sock a CURVE client that talks only to the server holding server_key."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = server_key
