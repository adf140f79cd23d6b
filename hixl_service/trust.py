"""Trusted peers: who a calling daemon is, whether it may link, and the link's key.

The ``[security]`` section at work (docs/security.md; the design in
docs/architecture.md):

* ``mtls``: the gRPC listeners require client certificates signed by
  ``tls_ca`` and outbound peer channels present this daemon's; a peer's
  identity is its certificate's SPIFFE URI SAN, else its DNS SAN, else its
  CN. The link key is drawn at random and travels in the Hello reply, inside
  TLS.
* ``token``: both daemons know one secret. Linking takes a ``Challenge``
  (a fresh server nonce, single use, short-lived) and a Hello that answers
  it with an HMAC over both nonces and the link's ends; the reply proves the
  server knows the secret too, and both derive the link key from the secret
  and the nonces, so neither the secret nor the key crosses the wire. The
  identity is the peer's IP address.
* ``none``: no proof; the identity is the peer's IP address; the link key
  travels in the Hello reply.

Every mode gives each link a 32-byte key that its data connections prove
(``hixl_native``'s data server challenges each connection), and
``allowed_peers`` decides which identities may link to which clusters and
which may write.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import hixl_native

from hixl_wire.status import LLMException, LLMStatusCode

from .config import AllowedPeer, LimitsConfig, SecurityConfig
from .listeners import StartRefused
from .rpc_errors import CallRefused

logger = logging.getLogger(__name__)

NONCE_BYTES = 32
MIN_SECRET_BYTES = 16
# A challenge must be answered within this, once; at most this many wait.
CHALLENGE_TTL_S = 30.0
MAX_OPEN_CHALLENGES = 4096
_HELLO_LABEL = b"hixl-hello-v1"
_WELCOME_LABEL = b"hixl-welcome-v1"
_KEY_LABEL = b"hixl-link-key-v1"


def read_secret(path: Path) -> bytes:
    """The token file's secret, after checking that only the daemon's user can read it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise StartRefused(f"security.token_file {path}: {exc.strerror}") from None
    if info.st_uid != os.geteuid():
        raise StartRefused(f"security.token_file {path} is owned by uid {info.st_uid}, not by "
                           f"the daemon's user (uid {os.geteuid()})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise StartRefused(f"security.token_file {path} has mode "
                           f"{stat.S_IMODE(info.st_mode):04o}: chmod 0600 it (group and "
                           f"others must not read the secret)")
    secret = path.read_bytes().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise StartRefused(f"security.token_file {path} holds {len(secret)} bytes; a secret "
                           f"needs at least {MIN_SECRET_BYTES} (e.g. openssl rand -hex 32)")
    return secret


def _read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StartRefused(f"security.{what} {path}: {exc.strerror}") from None


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    message = label + b"".join(len(part).to_bytes(4, "little") + part for part in parts)
    return hmac.new(secret, message, hashlib.sha256).digest()


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "little")


@dataclass(frozen=True)
class HelloFacts:
    """What a token-mode Hello proof covers: both nonces and the link's ends."""

    challenge: bytes
    client_nonce: bytes
    daemon_id: str
    src_cluster_id: int
    dst_cluster_id: int

    def parts(self) -> tuple[bytes, ...]:
        return (self.challenge, self.client_nonce, self.daemon_id.encode(),
                _u64(self.src_cluster_id), _u64(self.dst_cluster_id))


def certificate_identity(pem: bytes) -> str:
    """A certificate's identity: its SPIFFE URI SAN, else its first DNS SAN, else its CN."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        names: x509.SubjectAlternativeName | None = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = None
    if names is not None:
        uris = [uri for uri in names.get_values_for_type(x509.UniformResourceIdentifier)
                if uri.startswith("spiffe://")]
        if uris:
            return str(uris[0])
        dns = names.get_values_for_type(x509.DNSName)
        if dns:
            return str(dns[0])
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common[0].value) if common else ""


def _peer_host(peer: str) -> str:
    """The address of gRPC's ``context.peer()`` ("ipv4:1.2.3.4:5", "ipv6:[::1]:5")."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


class Challenges:
    """Nonces handed out by Peer.Challenge, each good for one Hello within its TTL."""

    def __init__(self) -> None:
        self._open: OrderedDict[bytes, float] = OrderedDict()

    def issue(self) -> bytes:
        now = time.monotonic()
        self._expire(now)
        while len(self._open) >= MAX_OPEN_CHALLENGES:
            self._open.popitem(last=False)  # the oldest goes: the rate limit bounds churn
        nonce = secrets.token_bytes(NONCE_BYTES)
        self._open[nonce] = now + CHALLENGE_TTL_S
        return nonce

    def take(self, nonce: bytes) -> bool:
        """Consume ``nonce``: True once for a nonce issued and not yet expired."""
        self._expire(time.monotonic())
        return self._open.pop(nonce, None) is not None

    def _expire(self, now: float) -> None:
        while self._open:
            nonce, until = next(iter(self._open.items()))
            if until > now:
                break
            del self._open[nonce]


class HelloGate:
    """A token bucket over link attempts: ``rate`` a second, bursts of ``burst``."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def admit(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            raise CallRefused(f"too many link attempts: limits.hello_rate is {self._rate:g} a "
                              f"second (bursts of limits.hello_burst = {self._burst}); retry "
                              f"later", LLMStatusCode.LLM_LINK_FAILED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED, reason="hello_rate")
        self._tokens -= 1


@dataclass(frozen=True)
class LinkGrant:
    """What an accepted Hello grants: the link's key and whether it may write."""

    key: bytes
    may_write: bool
    # token mode: the reply's proof that this daemon knows the secret
    server_proof: bytes = b""
    # none and mtls: the key itself travels in the reply
    reply_key: bytes = b""


class Trust:
    """The daemon's [security] and [limits] settings, loaded and checked at start."""

    def __init__(self, config: SecurityConfig, limits: LimitsConfig) -> None:
        self.mode = config.mode
        self.limits = limits
        self._allowed: dict[str, AllowedPeer] = {p.identity: p for p in config.allowed_peers}
        self._secret = b""
        self._cert = self._key = self._ca = b""
        if config.mode == "token":
            assert config.token_file is not None
            self._secret = read_secret(config.token_file)
        if config.mode == "mtls":
            assert config.tls_cert and config.tls_key and config.tls_ca
            self._cert = _read_pem(config.tls_cert, "tls_cert")
            self._key = _read_pem(config.tls_key, "tls_key")
            self._ca = _read_pem(config.tls_ca, "tls_ca")
            try:
                certificate_identity(self._cert)
            except ValueError as exc:
                raise StartRefused(f"security.tls_cert {config.tls_cert}: not a PEM "
                                   f"certificate ({exc})") from None
        self.challenges = Challenges()
        self.hello_gate = HelloGate(limits.hello_rate, limits.hello_burst)

    def update(self, allowed_peers: list[AllowedPeer], limits: LimitsConfig) -> None:
        """Take a reloaded allow-list and limits (SIGHUP); they apply to new links from now
        on, links already made stay. The credentials and the mode stay as started."""
        self._allowed = {p.identity: p for p in allowed_peers}
        if (limits.hello_rate, limits.hello_burst) != (self.limits.hello_rate,
                                                       self.limits.hello_burst):
            self.hello_gate = HelloGate(limits.hello_rate, limits.hello_burst)
        self.limits = limits

    # -- gRPC credentials ---------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """Credentials of every TCP gRPC listener; None: plaintext (modes none, token)."""
        if self.mode != "mtls":
            return None
        return grpc.ssl_server_credentials([(self._key, self._cert)],
                                           root_certificates=self._ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """Credentials of outbound peer channels; None: plaintext."""
        if self.mode != "mtls":
            return None
        return grpc.ssl_channel_credentials(root_certificates=self._ca,
                                            private_key=self._key,
                                            certificate_chain=self._cert)

    # -- who calls ----------------------------------------------------------

    def identity_of(self, context: Any) -> str:
        """The calling peer's identity (see the module docstring)."""
        if self.mode == "mtls":
            pem = (context.auth_context() or {}).get("x509_pem_cert") or []
            if not pem:
                raise CallRefused("no client certificate", LLMStatusCode.LLM_LINK_FAILED,
                                  grpc.StatusCode.UNAUTHENTICATED, reason="no_certificate")
            return certificate_identity(pem[0])
        return _peer_host(str(context.peer()))

    def permission(self, identity: str, cluster_id: int) -> bool:
        """Whether ``identity`` may link to ``cluster_id``; returns whether it may write."""
        if not self._allowed:
            return True
        entry = self._allowed.get(identity)
        if entry is None:
            raise CallRefused(f"peer {identity!r} is not in security.allowed_peers of this "
                              f"daemon", LLMStatusCode.LLM_LINK_FAILED,
                              grpc.StatusCode.PERMISSION_DENIED, reason="not_allowed_peer")
        if entry.clusters and cluster_id not in entry.clusters:
            raise CallRefused(f"peer {identity!r} may link to clusters {entry.clusters} of this "
                              f"daemon, not to {cluster_id} (security.allowed_peers)",
                              LLMStatusCode.LLM_LINK_FAILED, grpc.StatusCode.PERMISSION_DENIED,
                              reason="cluster_not_allowed")
        return entry.write

    # -- the token handshake, both ends ----------------------------------------

    def hello_proof(self, facts: HelloFacts) -> bytes:
        return _mac(self._secret, _HELLO_LABEL, *facts.parts())

    def welcome_proof(self, facts: HelloFacts, token: int) -> bytes:
        return _mac(self._secret, _WELCOME_LABEL, *facts.parts(), _u64(token))

    def derived_key(self, facts: HelloFacts, token: int) -> bytes:
        return _mac(self._secret, _KEY_LABEL, *facts.parts(), _u64(token))

    def check_hello(self, facts: HelloFacts, proof: bytes) -> None:
        """Server side of a token-mode Hello: a fresh challenge, answered with the secret."""
        if not self.challenges.take(facts.challenge):
            raise CallRefused("the Hello answers no open challenge (unknown, expired or used "
                              "already): call Challenge first", LLMStatusCode.LLM_LINK_FAILED,
                              grpc.StatusCode.UNAUTHENTICATED, reason="no_challenge")
        if len(facts.client_nonce) != NONCE_BYTES or not hmac.compare_digest(
                proof, self.hello_proof(facts)):
            raise CallRefused("the Hello's proof does not match this daemon's secret "
                              "(security.token_file differs?)", LLMStatusCode.LLM_LINK_FAILED,
                              grpc.StatusCode.UNAUTHENTICATED, reason="bad_proof")

    def grant(self, facts: HelloFacts | None, token: int, may_write: bool) -> LinkGrant:
        """The key of a new link, and what its Hello reply carries of it."""
        if self.mode == "token":
            assert facts is not None
            return LinkGrant(self.derived_key(facts, token), may_write,
                             server_proof=self.welcome_proof(facts, token))
        key = secrets.token_bytes(hixl_native.KEY_SIZE)
        return LinkGrant(key, may_write, reply_key=key)

    def accept_welcome(self, facts: HelloFacts, token: int, server_proof: bytes) -> bytes:
        """Client side: check that the far daemon knows the secret; the link key."""
        if not hmac.compare_digest(server_proof, self.welcome_proof(facts, token)):
            raise LLMException("the peer's Hello reply does not prove this daemon's secret "
                               "(security.token_file differs, or someone else answered)",
                               status_code=LLMStatusCode.LLM_LINK_FAILED)
        return self.derived_key(facts, token)


def new_client_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def insecure_trust() -> Trust:
    """Mode none with the default limits: in-process engines built without a config."""
    return Trust(SecurityConfig(), LimitsConfig())
