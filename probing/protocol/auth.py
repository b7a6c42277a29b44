"""Authentication of TCP connections to an agent: a shared token, and a challenge–response over it
that keeps the token off the wire and makes a recorded handshake useless on a new connection.

The agent speaks first; fixed sizes, so that the agent can read a handshake without a thread
(a selector in its accept loop) and a peer can never make it reserve memory:

    agent  -> CHALLENGE  MAGIC (8) + agent nonce (32)
    client -> RESPONSE   client nonce (32) + HMAC(key, "client" + agent nonce + client nonce) (32)
    agent  -> VERDICT    ACCEPTED + HMAC(key, "agent" + client nonce + agent nonce) (32)
                         or REFUSED + 32 zero bytes, and the agent hangs up

Each side proves it knows the token: the agent's nonce is fresh per connection, so a replayed
response fails; the client checks the agent's proof, so a process that registered a false
endpoint cannot pose as a rank.

After an accepted verdict every byte in both directions travels in sealed records
(protocol/sealed.py), under a key of this connection alone that both ends derive and never send:

    session key = HMAC(key, "session" + agent nonce + client nonce)
    record      = length (u32, 1 byte to 1 MiB) + data
                  + HMAC(session key, direction + sequence number (u64) + length + data)

with a sequence number per direction, counted from 0. The records carry the usual frames
(hello first), exactly as the Unix socket does. A relay that passed the handshake along thus
owns nothing: a byte it adds, changes, replays, reorders, reflects or drops fails a record's
check, which ends the connection (the agent runs nothing from it). Nothing here encrypts:
traffic is readable on the way; docs/decisions.md says what that leaves open.

The token: PROBING_TOKEN, else the file PROBING_TOKEN_FILE, else ~/.probing/token; a file must be
a regular file of the user's own that nobody else can read or write (0600).

Standard library only, Python 3.8 syntax: the agent imports it.
"""

from __future__ import annotations

import os
import stat

# SHA-256 and HMAC from CPython's built-in module rather than hashlib and hmac: those load OpenSSL,
# which costs an agent ~3.5 MB of private memory in every rank that listens. Same digests.
try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]  # CPython 3.8-3.11
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # 3.12+
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[assignment,no-redef,unused-ignore]  # other
from _operator import _compare_digest as compare_digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Optional, Tuple

MAGIC = b"PROBING\x01"
NONCE_BYTES = 32
MAC_BYTES = 32
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES
RESPONSE_BYTES = NONCE_BYTES + MAC_BYTES
VERDICT_BYTES = 1 + MAC_BYTES
ACCEPTED = b"K"
REFUSED = b"X"

TOKEN_ENV = "PROBING_TOKEN"
TOKEN_FILE_ENV = "PROBING_TOKEN_FILE"
DEFAULT_TOKEN_FILE = os.path.join("~", ".probing", "token")
MIN_TOKEN_CHARS = 16
TOKEN_HINT = (
    "give every node the same secret: export PROBING_TOKEN=$(python3 -c 'import secrets; "
    "print(secrets.token_hex(16))'), or write it to ~/.probing/token (chmod 600) in a shared home"
)


class TokenError(Exception):
    """No usable token: the message says which source was tried and what is wrong with it."""


class HandshakeError(Exception):
    """The peer is not an agent speaking this handshake, or it refused our token."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def load_token(environ: Optional[Mapping[str, str]] = None) -> str:
    """The shared token, from the environment or the token file; TokenError says why not."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV)
    if token is not None:
        return _checked(token.strip(), f"${TOKEN_ENV}")
    path = os.path.expanduser(env.get(TOKEN_FILE_ENV) or DEFAULT_TOKEN_FILE)
    where = f"${TOKEN_FILE_ENV} ({path})" if env.get(TOKEN_FILE_ENV) else path
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TokenError(f"no token: ${TOKEN_ENV} is not set and there is no {where}") from None
    except OSError as error:
        raise TokenError(f"cannot read the token file {where}: {error.strerror or error}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"the token file {where} is not a regular file")
        if info.st_uid != os.geteuid():
            owner = f"uid {info.st_uid}, not to uid {os.geteuid()}"
            raise TokenError(f"the token file {where} belongs to {owner}")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise TokenError(
                f"the token file {where} is open to others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"chmod 600 {path}"
            )
        data = os.read(descriptor, 4096)
    finally:
        os.close(descriptor)
    return _checked(data.decode("utf-8", "replace").strip(), f"the token file {where}")


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the token in {where} is too short: {MIN_TOKEN_CHARS} characters at least")
    return token


def key_of(token: str) -> bytes:
    return bytes(_sha256(b"probing-token\x00" + token.encode("utf-8")).digest())


_BLOCK = 64  # SHA-256's block size: HMAC pads its key to it (RFC 2104)
_INNER = bytes(byte ^ 0x36 for byte in range(256))
_OUTER = bytes(byte ^ 0x5C for byte in range(256))


class HmacSha256:
    """HMAC-SHA256 (RFC 2104) under one key, its padded key blocks hashed once: a sealed record
    costs the hashing of its own bytes only (protocol/sealed.py MACs every record)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes, sha256: Optional[Callable[[bytes], Any]] = None) -> None:
        """`sha256`: another implementation of it (OpenSSL's, where it is loaded anyway)."""
        new = sha256 or _sha256
        if len(key) > _BLOCK:
            key = new(key).digest()
        key = key.ljust(_BLOCK, b"\x00")
        self._inner = new(key.translate(_INNER))
        self._outer = new(key.translate(_OUTER))

    def digest(self, parts: Iterable[Any]) -> bytes:
        """The MAC of the concatenation of `parts` (bytes-like objects), without joining them."""
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return bytes(outer.digest())


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104), as hmac.new(key, message, "sha256").digest() computes it."""
    return HmacSha256(key).digest((message,))


def _mac(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac_sha256(key, label + b"\x00" + first + second)


def session_key(key: bytes, agent_nonce: bytes, response: bytes) -> bytes:
    """The key of one authenticated connection's records (protocol/sealed.py): both ends derive
    it from the handshake they shared (the agent's nonce, the client's RESPONSE); it never
    crosses the wire, and no other connection, earlier or later, has the same."""
    return _mac(key, b"session", agent_nonce, response[:NONCE_BYTES])


# --- the agent's side --------------------------------------------------------------------------


def challenge() -> Tuple[bytes, bytes]:
    """(agent nonce, the CHALLENGE to send)."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, MAGIC + nonce


def verdict(key: bytes, agent_nonce: bytes, response: bytes) -> Tuple[bool, bytes]:
    """(whether the client proved the token, the VERDICT to send it)."""
    if len(response) != RESPONSE_BYTES:
        return False, REFUSED + bytes(MAC_BYTES)
    client_nonce, proof = response[:NONCE_BYTES], response[NONCE_BYTES:]
    if not compare_digest(proof, _mac(key, b"client", agent_nonce, client_nonce)):
        return False, REFUSED + bytes(MAC_BYTES)
    return True, ACCEPTED + _mac(key, b"agent", client_nonce, agent_nonce)


# --- the client's side -------------------------------------------------------------------------


def respond(key: bytes, challenge_bytes: bytes) -> Tuple[bytes, bytes]:
    """(the agent's nonce, the RESPONSE to send) for a CHALLENGE; HandshakeError if it is none."""
    if len(challenge_bytes) != CHALLENGE_BYTES or not challenge_bytes.startswith(MAGIC):
        raise HandshakeError("the peer is not a probing agent listening on TCP (no challenge)")
    agent_nonce = challenge_bytes[len(MAGIC) :]
    client_nonce = os.urandom(NONCE_BYTES)
    return agent_nonce, client_nonce + _mac(key, b"client", agent_nonce, client_nonce)


def check_verdict(key: bytes, agent_nonce: bytes, response: bytes, verdict_bytes: bytes) -> None:
    """Raises HandshakeError unless the agent accepted us and proved it knows the token too."""
    if len(verdict_bytes) != VERDICT_BYTES or verdict_bytes[:1] not in (ACCEPTED, REFUSED):
        raise HandshakeError("the peer broke off the handshake")
    if verdict_bytes[:1] == REFUSED:
        raise HandshakeError("the agent refused our token", refused=True)
    client_nonce = response[:NONCE_BYTES]
    if not compare_digest(verdict_bytes[1:], _mac(key, b"agent", client_nonce, agent_nonce)):
        raise HandshakeError("the peer accepted us without knowing the token: it is not the job's agent")
