"""Shared bits of the client commands: --bootstrap-server, one-line errors, progress."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from samsa.broker.config import ConfigError as PropertiesError
from samsa.broker.config import load_config_file
from samsa.client import ClosedError, ConfigError, KafkaError
from samsa.client._security import Security
from samsa.client._security import from_config as security_from_config

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT",
        help=f"broker to connect to (default {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--command-timeout-ms",
        type=int,
        default=30_000,
        metavar="MS",
        help="request timeout (default 30000)",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        help="client properties, e.g. security.protocol, sasl.*, ssl.* (as Kafka's tools)",
    )


def command_config(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--command-config`` properties file, if one was given."""
    path = getattr(args, "command_config", None)
    if path is None:
        return {}
    try:
        return dict(load_config_file(Path(path)))
    except PropertiesError as exc:
        raise ConfigError(str(exc)) from None


def command_security(args: argparse.Namespace) -> Security:
    """TLS and SASL settings for commands that speak raw protocol (BlockingConnection)."""
    return security_from_config(command_config(args))


def client_config(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": args.bootstrap_server,
        "request.timeout.ms": args.command_timeout_ms,
        "client.id": "samsa-cli",
        **command_config(args),
        **extra,
    }


def one_line_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Client failures become one line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (KafkaError, ConfigError, ClosedError, OSError, ValueError) as exc:
            print(f"samsa {args.command}: error: {exc}", file=sys.stderr)
            return 1

    return wrapper


class Progress:
    """Prints a count on stderr at most every ``interval`` seconds (and at the end)."""

    def __init__(self, what: str, interval: float = 2.0, enabled: bool = True) -> None:
        self.what = what
        self.interval = interval
        self.enabled = enabled
        self.count = 0
        self._start = time.monotonic()
        self._last = self._start

    def add(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            rate = self.count / max(now - self._start, 1e-9)
            print(f"... {self.count} {self.what} ({rate:.0f}/s)", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self._start
            print(f"{self.count} {self.what} in {elapsed:.1f}s", file=sys.stderr, flush=True)


def add_properties(parser: argparse.ArgumentParser, tool: str, role: str, keys: str) -> None:
    """The console tools' ``--property`` (alias ``--{tool}-property``) and
    ``--{role}-property`` (a client setting), as Kafka's console producer and consumer."""
    parser.add_argument(
        "--property",
        f"--{tool}-property",
        action="append",
        metavar="K=V",
        help=f"kafka-console-{role}'s {keys}, ...",
    )
    parser.add_argument(
        f"--{role}-property", action="append", metavar="K=V", help="a client setting"
    )


def parse_properties(items: list[str] | None, what: str) -> dict[str, str]:
    """Kafka's repeated ``--property k=v`` (and ``--producer-property`` ...) as a dict."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out
