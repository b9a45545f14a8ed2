"""SASL mechanisms as sans-IO state machines: PLAIN (RFC 4616) and SCRAM-SHA-256/512
(RFC 5802, RFC 7677), both sides.

Only ``hashlib``/``hmac``/``secrets`` primitives; no channel binding (Kafka has none either).
The broker's side takes a credential lookup and never sees a SCRAM password; the client's
side is what samsa's client runs inside SaslAuthenticate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

SCRAM_MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism type bytes (DescribeUserScramCredentials, AlterUserScramCredentials).
SCRAM_MECHANISM_TYPES: dict[int, str] = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
# Kafka's ScramMechanism minimum; also its default for kafka-configs --add-config.
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 16384  # Kafka's upper bound too (KIP-554)


class SaslError(Exception):
    """Authentication failed; the message is safe to send to the client (no secrets)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(SCRAM_MECHANISMS[mechanism], password.encode(), salt, iterations)


def make_credential(
    mechanism: str,
    password: str,
    iterations: int = SCRAM_MIN_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """The stored form of a password (RFC 5802 section 3): the password itself is not kept."""
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be between {SCRAM_MIN_ITERATIONS} and {SCRAM_MAX_ITERATIONS}"
        )
    salt = salt if salt is not None else secrets.token_bytes(32)
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_from_salted(mechanism, salted, salt, iterations)


def credential_from_salted(
    mechanism: str, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """The stored form from a SaltedPassword, which AlterUserScramCredentials carries."""
    hash_name = SCRAM_MECHANISMS[mechanism]
    client_key = _hmac(hash_name, salted, b"Client Key")
    return ScramCredential(
        salt=salt,
        stored_key=hashlib.new(hash_name, client_key).digest(),
        server_key=_hmac(hash_name, salted, b"Server Key"),
        iterations=iterations,
    )


def mock_credential(secret: bytes, mechanism: str, user: str, iterations: int) -> ScramCredential:
    """What an unknown user is answered with (RFC 5802 section 9 suggests it): a credential
    derived from a server secret and the name, so the same unknown name always gets the same
    salt (as a real user does), and no PBKDF2 is spent on it (unlike a real user's login)."""
    hash_name = SCRAM_MECHANISMS[mechanism]
    key = _hmac(hash_name, secret, f"{mechanism}\0{user}".encode())
    return ScramCredential(
        salt=_hmac("sha256", key, b"salt"),  # 32 bytes, as make_credential's salts
        stored_key=_hmac(hash_name, key, b"stored key"),
        server_key=_hmac(hash_name, key, b"server key"),
        iterations=iterations,
    )


_MOCK_SECRET = secrets.token_bytes(32)  # for servers given no mock of their own


def _attributes(message: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslError("malformed SCRAM message")
        attrs.setdefault(key, value)
    return attrs


def _saslname_decode(name: str) -> str:
    if "," in name or "=" in name.replace("=2C", "").replace("=3D", ""):
        raise SaslError("malformed SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _saslname_encode(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslError("malformed SCRAM message") from None


# -- server side ----------------------------------------------------------------------------

CredentialLookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism)
MockCredential = Callable[[str, str], ScramCredential]  # (user, mechanism), for unknown users
PlainCheck = Callable[[str, str], bool]  # (user, password)


class ServerMechanism:
    """One authentication exchange on the broker: ``step`` takes each client token and
    returns the reply; ``complete`` and ``user`` once it succeeded. SaslError on failure."""

    complete = False
    user: str | None = None

    def step(self, token: bytes) -> bytes:
        raise NotImplementedError


class PlainServer(ServerMechanism):
    def __init__(self, check: PlainCheck) -> None:
        self._check = check

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslError("PLAIN exchange already complete")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslError("malformed PLAIN message")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslError("malformed PLAIN message") from None
        if not user:
            raise SaslError("PLAIN: empty user name")
        if authzid and authzid != user:
            raise SaslError("PLAIN: authorization id must match the user name")
        if not self._check(user, password):
            raise SaslError("Authentication failed: Invalid username or password")
        self.complete, self.user = True, user
        return b""


class ScramServer(ServerMechanism):
    def __init__(
        self,
        mechanism: str,
        lookup: CredentialLookup,
        *,
        nonce: str | None = None,
        mock: MockCredential | None = None,
    ) -> None:
        self.mechanism = mechanism
        self._own_nonce = nonce  # tests give RFC 7677's; otherwise fresh per exchange
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._lookup = lookup
        self._mock = mock or (
            lambda user, mech: mock_credential(_MOCK_SECRET, mech, user, SCRAM_MIN_ITERATIONS)
        )
        self._state = 0
        self._credential: ScramCredential | None = None
        self._known = False
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslError("malformed SCRAM message") from None
        if self._state == 0:
            return self._first(text).encode()
        if self._state == 1:
            return self._final(text).encode()
        raise SaslError("SCRAM exchange already complete")

    def _first(self, text: str) -> str:
        # gs2-header: "n,," or "y,," (no channel binding), optionally with an authzid "a=".
        flag, sep1, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or flag not in ("n", "y"):
            raise SaslError("SCRAM: channel binding is not supported")
        attrs = _attributes(bare)
        if "m" in attrs or "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise SaslError("malformed SCRAM client-first message")
        user = _saslname_decode(attrs["n"])
        if authzid and authzid != "a=" + _saslname_encode(user):
            raise SaslError("SCRAM: authorization id must match the user name")
        cred = self._lookup(user, self.mechanism)
        self._known = cred is not None
        if cred is None:
            # Go on with a mock credential so an unknown user fails like a wrong password.
            cred = self._mock(user, self.mechanism)
        self.user = user
        self._credential = cred
        self._gs2 = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = attrs["r"] + (self._own_nonce or secrets.token_urlsafe(24))
        self._server_first = f"r={self._nonce},s={_b64(cred.salt)},i={cred.iterations}"
        self._state = 1
        return self._server_first

    def _final(self, text: str) -> str:
        self._state = 2
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise SaslError("malformed SCRAM client-final message")
        attrs = _attributes(without_proof)
        if attrs.get("c") != _b64(self._gs2.encode()):
            raise SaslError("SCRAM: channel binding does not match")
        if attrs.get("r") != self._nonce:
            raise SaslError("SCRAM: nonce does not match")
        cred = self._credential
        assert cred is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._hash, cred.stored_key, auth_message)
        proof = _unb64(proof_part)
        if len(proof) != len(signature):
            raise SaslError("Authentication failed: Invalid user credentials")
        client_key = _xor(proof, signature)
        ok = hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), cred.stored_key)
        if not (ok and self._known):
            raise SaslError("Authentication failed: Invalid user credentials")
        self.complete = True
        return "v=" + _b64(_hmac(self._hash, cred.server_key, auth_message))


def server_mechanism(
    mechanism: str,
    lookup: CredentialLookup,
    plain: PlainCheck,
    mock: MockCredential | None = None,
) -> ServerMechanism:
    if mechanism == "PLAIN":
        return PlainServer(plain)
    return ScramServer(mechanism, lookup, mock=mock)


# -- client side ----------------------------------------------------------------------------


class ClientMechanism:
    """The client's half: ``first()`` then ``step(reply)`` until ``done``."""

    done = False

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, reply: bytes) -> bytes | None:
        raise NotImplementedError


class PlainClient(ClientMechanism):
    def __init__(self, user: str, password: str) -> None:
        self._token = b"\0" + user.encode() + b"\0" + password.encode()

    def first(self) -> bytes:
        return self._token

    def step(self, reply: bytes) -> bytes | None:
        self.done = True
        return None


class ScramClient(ClientMechanism):
    def __init__(
        self, mechanism: str, user: str, password: str, *, nonce: str | None = None
    ) -> None:
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        self.mechanism = mechanism
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._password = password
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._bare = f"n={_saslname_encode(user)},r={self._nonce}"
        self._server_signature = b""
        self._state = 0

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def step(self, reply: bytes) -> bytes | None:
        text = reply.decode()
        if self._state == 0:
            self._state = 1
            attrs = _attributes(text)
            nonce, iterations = attrs.get("r", ""), int(attrs.get("i", "0"))
            if not nonce.startswith(self._nonce) or iterations < SCRAM_MIN_ITERATIONS:
                raise SaslError("invalid SCRAM server-first message")
            salted = salted_password(
                self.mechanism, self._password, _unb64(attrs.get("s", "")), iterations
            )
            without_proof = f"c={_b64(b'n,,')},r={nonce}"
            auth_message = f"{self._bare},{text},{without_proof}".encode()
            client_key = _hmac(self._hash, salted, b"Client Key")
            stored_key = hashlib.new(self._hash, client_key).digest()
            proof = _xor(client_key, _hmac(self._hash, stored_key, auth_message))
            server_key = _hmac(self._hash, salted, b"Server Key")
            self._server_signature = _hmac(self._hash, server_key, auth_message)
            return f"{without_proof},p={_b64(proof)}".encode()
        attrs = _attributes(text)
        if "e" in attrs or not hmac.compare_digest(
            _unb64(attrs.get("v", "")), self._server_signature
        ):
            raise SaslError("SCRAM: the broker's signature does not verify")
        self.done = True
        return None


def client_mechanism(mechanism: str, user: str, password: str) -> ClientMechanism:
    if mechanism == "PLAIN":
        return PlainClient(user, password)
    return ScramClient(mechanism, user, password)
