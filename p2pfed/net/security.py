"""CURVE key pairs and the allow-list of peers a keyed mesh accepts.

The allow-list is a folder of public keys, one file per member: ``allowed/NAME.key`` is the key of the
member called NAME, and the only key that may speak for NAME. So a name is bound to one key for good: no
allowed key can take another member's name, alive or dead, and a member's name and key file go together
(``p2pfed keys generate DIR --name NAME`` writes both).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

log = logging.getLogger(__name__)

ALLOWED_DIR = "allowed"


@dataclass(frozen=True)
class Keys:
    """A node's own CURVE key pair (z85 bytes) and the folder of public keys it accepts, by member name."""

    public: bytes
    secret: bytes
    allowed_dir: Path
    allowed: frozenset[bytes]
    names: dict[str, bytes] = field(default_factory=dict)  # member name (key file name) -> its public key

    def key_of(self, name: str) -> bytes | None:
        """The public key that may speak for member name, None if name is not in the allow-list."""
        return self.names.get(name)

    def server_key_for(self, name: str) -> bytes | None:
        """Public key of an allowed peer by its key file's name (e.g. 'bootstrap'), if present."""
        path = self.allowed_dir / f"{name}.key"
        if not path.exists():
            return None
        public, _ = zmq.auth.load_certificate(str(path))
        return public


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
                names=names)


def own_name(keys: Keys) -> str | None:
    """The member name this node's own key is allowed as (its key file's name), if it is in the allow-list."""
    return next((n for n, k in keys.names.items() if k == keys.public), None)


def start_authenticator(ctx: zmq.asyncio.Context, keys: Keys) -> AsyncioAuthenticator:
    """Start a ZAP handler on ctx that admits only CURVE clients whose public key is allowed."""
    auth = AsyncioAuthenticator(ctx)
    auth.start()
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
