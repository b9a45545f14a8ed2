"""SASL on the broker: who may log in (SCRAM credentials in the data directory, PLAIN users
from a file) and one connection's authentication state.

SCRAM credentials live in ``<data dir>/scram-credentials.json`` (salt, StoredKey,
ServerKey, iterations per user and mechanism; never a password), written atomically (a
temporary file, fsync, rename, fsync of the directory), so a crash leaves the old or the new
file. ``samsa users`` writes it, before the broker's first start too; the broker rereads it
when it changes, so a user added while it runs can log in at once.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hmac
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from samsa.broker.oauthbearer import (
    OAUTHBEARER,
    AuthenticationRefused,
    OAuthBearerServer,
    TokenValidator,
)
from samsa.log.durable import write_atomically
from samsa.protocol.errors import ErrorCode
from samsa.protocol.sasl import (
    SCRAM_MAX_ITERATIONS,
    SCRAM_MECHANISM_TYPES,
    SCRAM_MECHANISMS,
    SCRAM_MIN_ITERATIONS,
    SaslError,
    ScramCredential,
    ServerMechanism,
    credential_from_salted,
    mock_credential,
    server_mechanism,
)

CREDENTIALS_FILE = "scram-credentials.json"
MOCK_SECRET_FILE = "scram-mock-secret"  # keys the mock credentials of unknown users
LOG_TEXT_MAX = 256  # characters of a client-supplied string that a log line may carry


def clip(text: str, limit: int = LOG_TEXT_MAX) -> str:
    """At most ``limit`` characters of ``text``: a client's string may be megabytes long."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class CredentialError(Exception):
    pass


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class ScramCredentials:
    """The SCRAM credential file of a data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / CREDENTIALS_FILE
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._seen: tuple[int, int, int] | None = None
        self._usual: tuple[Any, dict[str, int]] = (None, {})  # _seen -> mechanism -> count
        self._mock_secret: bytes | None = None

    def _refresh(self) -> None:
        key = _stat_key(self.path)
        if key == self._seen:
            return
        self._users = self._read() if key is not None else {}
        self._seen = key

    def _read(self) -> dict[str, dict[str, ScramCredential]]:
        try:
            doc = json.loads(self.path.read_text())
            users: dict[str, dict[str, ScramCredential]] = {}
            for user, mechs in doc["users"].items():
                users[user] = {
                    mech: ScramCredential(
                        salt=base64.b64decode(c["salt"]),
                        stored_key=base64.b64decode(c["stored_key"]),
                        server_key=base64.b64decode(c["server_key"]),
                        iterations=int(c["iterations"]),
                    )
                    for mech, c in mechs.items()
                    if mech in SCRAM_MECHANISMS
                }
            return users
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CredentialError(f"cannot read SCRAM credentials {self.path}: {exc}") from None

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        self._refresh()
        return self._users.get(user, {}).get(mechanism)

    def mock(self, user: str, mechanism: str) -> ScramCredential:
        """The credential an unknown user is answered with: stable per name (keyed by a
        secret kept in the data directory, so a restart does not change it either), with the
        iteration count most real users have, and no PBKDF2 (see ``mock_credential``)."""
        self._refresh()
        seen, usual = self._usual
        if seen != self._seen or seen is None:
            counts: dict[str, dict[int, int]] = {}
            for mechs in self._users.values():
                for mech, cred in mechs.items():
                    per = counts.setdefault(mech, {})
                    per[cred.iterations] = per.get(cred.iterations, 0) + 1
            usual = {m: max(per, key=per.__getitem__) for m, per in counts.items()}
            self._usual = (self._seen, usual)
        iterations = usual.get(mechanism, SCRAM_MIN_ITERATIONS)
        return mock_credential(self._secret(), mechanism, user, iterations)

    def _secret(self) -> bytes:
        if self._mock_secret is None:
            path = self.path.parent / MOCK_SECRET_FILE
            try:
                secret = path.read_bytes()
            except FileNotFoundError:
                secret = b""
            if len(secret) < 32:
                secret = os.urandom(32)
                write_atomically(path, secret)
            self._mock_secret = secret
        return self._mock_secret

    def users(self) -> dict[str, dict[str, int]]:
        """user -> mechanism -> iterations (what DescribeUserScramCredentials shows)."""
        self._refresh()
        return {
            u: {m: c.iterations for m, c in sorted(mechs.items())}
            for u, mechs in sorted(self._users.items())
            if mechs
        }

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time across processes (`samsa users` and a running broker):
        read, change and write under an exclusive lock, so no change is lost."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.parent / f".{CREDENTIALS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._refresh()
            yield
        finally:
            os.close(fd)  # releases the lock

    def put(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        with self._locked():
            self._users.setdefault(user, {})[mechanism] = credential
            self._write()

    def delete(self, user: str, mechanism: str | None = None) -> bool:
        """Remove one mechanism's credential, or all of the user's; False if none was there."""
        with self._locked():
            mechs = self._users.get(user)
            if not mechs or (mechanism is not None and mechanism not in mechs):
                return False
            if mechanism is None:
                del self._users[user]
            else:
                del mechs[mechanism]
                if not mechs:
                    del self._users[user]
            self._write()
            return True

    def _write(self) -> None:
        doc: dict[str, Any] = {
            "version": 1,
            "users": {
                user: {
                    mech: {
                        "salt": base64.b64encode(c.salt).decode(),
                        "stored_key": base64.b64encode(c.stored_key).decode(),
                        "server_key": base64.b64encode(c.server_key).decode(),
                        "iterations": c.iterations,
                    }
                    for mech, c in mechs.items()
                }
                for user, mechs in self._users.items()
            },
        }
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self._seen = _stat_key(self.path)


class PlainUsers:
    """``sasl.plain.users.file``: USER=PASSWORD lines, reread when the file changes."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._users: dict[str, str] = {}
        self._seen: tuple[int, int, int] | None = None

    def check(self, user: str, password: str) -> bool:
        if self.path is None:
            return False
        key = _stat_key(self.path)
        if key != self._seen:
            self._users = {}
            if key is not None:
                for line in self.path.read_text().splitlines():
                    name, sep, secret = line.partition("=")
                    if sep and name.strip() and not name.lstrip().startswith("#"):
                        self._users[name.strip()] = secret.strip()
            self._seen = key
        expected = self._users.get(user)
        # Compare even for an unknown user, so timing does not tell which users exist.
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok


# Kafka's KafkaChannel: a SaslHandshake sooner than this after the last re-authentication
# began does not begin another, so a client cannot make the broker re-authenticate in a loop.
MIN_REAUTH_INTERVAL_S = 1.0


@dataclass(slots=True)
class SaslSession:
    """One SASL connection's state: SaslHandshake picks a mechanism, SaslAuthenticate runs
    it. Until ``principal`` is set, only ApiVersions and these two are served."""

    mechanisms: tuple[str, ...]
    scram: ScramCredentials
    plain: PlainUsers
    reauth_ms: int = 0  # connections.max.reauth.ms (KIP-368); 0: sessions never expire
    principal: str | None = None
    failed: str | None = None  # why; the connection closes once the response is sent
    lifetime_ms: int = 0  # of the current session, as SaslAuthenticate v1+ tells the client
    expires_at: float | None = None  # time.monotonic() deadline of the current session
    renewed_at: float | None = None  # when the last re-authentication began (monotonic)
    # SaslHandshake v0: the tokens then come as bare size-prefixed frames, not SaslAuthenticate
    raw_tokens: bool = False
    _mechanism: ServerMechanism | None = field(default=None, repr=False)
    _mechanism_name: str | None = None
    oauth: TokenValidator | None = field(default=None, repr=False)  # OAUTHBEARER's

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def renewing(self) -> bool:
        """A re-authentication is under way: its SaslHandshake was accepted, the mechanism
        has not completed."""
        return self.authenticated and self._mechanism is not None and not self._mechanism.complete

    def may_renew(self, now: float) -> bool:
        """Would a SaslHandshake now begin a re-authentication? Only for a session that ends,
        and (as Kafka's KafkaChannel) at most once a second: otherwise it is an ordinary
        request on an authenticated connection, refused with ILLEGAL_SASL_STATE."""
        if not self.authenticated or self.expires_at is None:
            return False
        return self.renewed_at is None or now - self.renewed_at >= MIN_REAUTH_INTERVAL_S

    @property
    def awaits_raw_token(self) -> bool:
        """After a v0 handshake, until the mechanism completes, each frame is a SASL token."""
        return self.raw_tokens and self._mechanism is not None and not self._mechanism.complete

    def handshake(self, mechanism: str, version: int = 1, now: float | None = None) -> ErrorCode:
        """``now``: time.monotonic(), unless given."""
        if self._mechanism is not None and not self._mechanism.complete:
            self.failed = "unexpected SaslHandshake"
            return ErrorCode.ILLEGAL_SASL_STATE
        if self.authenticated:
            now = time.monotonic() if now is None else now
            if not self.may_renew(now):
                # As Kafka answers it past its authenticator: an error, the session and the
                # connection kept (the client decides what to do).
                return ErrorCode.ILLEGAL_SASL_STATE
            self.renewed_at = now
        if mechanism not in self.mechanisms:
            self.failed = f"unsupported SASL mechanism {clip(mechanism)!r}"
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM
        if self.authenticated and mechanism != self._mechanism_name:
            # KIP-368: re-authentication keeps the mechanism it started with.
            self.failed = f"re-authentication may not switch to {mechanism}"
            return ErrorCode.ILLEGAL_SASL_STATE
        if mechanism == OAUTHBEARER:
            assert self.oauth is not None
            self._mechanism = OAuthBearerServer(self.oauth, reauthenticating=self.authenticated)
        else:
            self._mechanism = server_mechanism(
                mechanism, self.scram.lookup, self.plain.check, self.scram.mock
            )
        self._mechanism_name = mechanism
        self.raw_tokens = version == 0
        return ErrorCode.NONE

    def authenticate(self, token: bytes) -> tuple[ErrorCode, str | None, bytes]:
        mech = self._mechanism
        if mech is None or mech.complete:
            if self.authenticated:
                # Kafka's KafkaApis: answered with an error, the connection kept.
                message = "SaslAuthenticate request received after successful authentication"
                return ErrorCode.ILLEGAL_SASL_STATE, message, b""
            self.failed = "SaslAuthenticate without a SaslHandshake"
            return ErrorCode.ILLEGAL_SASL_STATE, "SaslHandshake must come first", b""
        try:
            reply = mech.step(token)
            principal = f"User:{mech.user}"
            if mech.complete and self.principal not in (None, principal):
                raise SaslError("re-authentication may not change the principal")
        except (SaslError, CredentialError) as exc:
            user = None if mech.user is None else clip(mech.user)
            why = exc.detail if isinstance(exc, AuthenticationRefused) else exc
            self.failed = f"SASL authentication failed (user {user!r}): {clip(str(why))}"
            message = str(exc) if isinstance(exc, SaslError) else "Authentication failed"
            return ErrorCode.SASL_AUTHENTICATION_FAILED, message, b""
        if mech.complete:
            self.principal = principal
            self._start_session(getattr(mech, "expires_ms", None))
        return ErrorCode.NONE, "", reply  # Kafka's default message: empty, not null

    def _start_session(self, credential_expires_ms: int | None) -> None:
        """KIP-368 as Kafka's SaslServerAuthenticator: the session ends at
        connections.max.reauth.ms or when the credential (an OAUTHBEARER token) expires,
        whichever is first; with neither, never."""
        self.lifetime_ms, self.expires_at = self.reauth_ms, None
        if credential_expires_ms is not None:
            left = max(0, credential_expires_ms - int(time.time() * 1000))
            self.lifetime_ms = min(left, self.reauth_ms) if self.reauth_ms else left
        if self.reauth_ms or credential_expires_ms is not None:
            self.expires_at = time.monotonic() + self.lifetime_ms / 1000


_STORES: dict[Path, ScramCredentials] = {}


def credentials_for(data_dir: Path) -> ScramCredentials:
    """The one credential store of a data directory, shared by the listeners and the admin
    APIs of this process."""
    key = Path(data_dir).resolve()
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = ScramCredentials(key)
    return store


# -- KIP-554: DescribeUserScramCredentials and AlterUserScramCredentials ---------------------

UserResult = tuple[str, ErrorCode, str | None]


def describe_credentials(
    store: ScramCredentials, users: list[str] | None
) -> list[tuple[str, ErrorCode, str | None, list[tuple[int, int]]]]:
    """Per user: error, message and (mechanism type, iterations) of each credential; all
    users when ``users`` is None or empty."""
    known = store.users()
    types = {name: t for t, name in SCRAM_MECHANISM_TYPES.items()}
    wanted = list(known) if not users else users
    out: list[tuple[str, ErrorCode, str | None, list[tuple[int, int]]]] = []
    for user in wanted:
        if users and users.count(user) > 1:
            message = "Cannot describe SCRAM credentials for the same user twice in a request"
            out.append((user, ErrorCode.DUPLICATE_RESOURCE, message, []))
        elif user not in known:
            out.append(
                (user, ErrorCode.RESOURCE_NOT_FOUND, "Attempt to describe a nonexistent user", [])
            )
        else:
            infos = [(types[m], it) for m, it in known[user].items()]
            out.append((user, ErrorCode.NONE, None, infos))
    return out


def alter_credentials(
    store: ScramCredentials,
    deletions: list[tuple[str, int]],
    upsertions: list[tuple[str, int, int, bytes, bytes]],
) -> list[UserResult]:
    """Apply deletions (user, mechanism type) and upsertions (user, mechanism type,
    iterations, salt, SaltedPassword); one change per user, one result each."""
    per_user: dict[str, list[tuple[int, tuple[int, bytes, bytes] | None]]] = {}
    for user, mech in deletions:
        per_user.setdefault(user, []).append((mech, None))  # None: delete
    for user, mech, iterations, salt, salted in upsertions:
        per_user.setdefault(user, []).append((mech, (iterations, salt, salted)))
    results: list[UserResult] = []
    for user, ops in per_user.items():
        problem = _alter_problem(store, user, ops)
        if problem is not None:
            results.append((user, *problem))
            continue
        for mech, upsert in ops:
            name = SCRAM_MECHANISM_TYPES[mech]
            if upsert is None:
                store.delete(user, name)
            else:
                iterations, salt, salted = upsert
                store.put(user, name, credential_from_salted(name, salted, salt, iterations))
        results.append((user, ErrorCode.NONE, None))
    return results


def _alter_problem(
    store: ScramCredentials, user: str, ops: list[tuple[int, tuple[int, bytes, bytes] | None]]
) -> tuple[ErrorCode, str] | None:
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    # As Kafka's controller: one change per user and request, whatever the mechanisms (so
    # kafka-configs cannot set SCRAM-SHA-256 and -512 at once); a change that fails first
    # answers its own error.
    for index, (mech, upsert) in enumerate(ops):
        if index:
            return (
                ErrorCode.DUPLICATE_RESOURCE,
                "A user credential cannot be altered twice in the same request",
            )
        name = SCRAM_MECHANISM_TYPES.get(mech)
        if name is None:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism type {mech}"
        if upsert is None:
            if store.lookup(user, name) is None:
                return (
                    ErrorCode.RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                )
            continue
        iterations, salt, salted = upsert
        if iterations < SCRAM_MIN_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
        if iterations > SCRAM_MAX_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
        if not salt or not salted:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty"
    return None
