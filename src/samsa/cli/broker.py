"""``samsa broker``: run a broker in the foreground.

A bad setting or usage ends with one line ``samsa broker: error: ...`` and exit status 2; a
broker that cannot start (address in use, unresolvable host, unusable data directory) or could
not shut down cleanly, with one such line and exit status 1. No traceback either way.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from pathlib import Path
from typing import Any

from samsa.broker.config import BrokerConfig, ConfigError, load_config_file, parse_host_port

EXIT_RUNTIME = 1
EXIT_USAGE = 2  # argparse's status for bad usage too


def _broker(args: argparse.Namespace) -> int:
    # kio registers Hypothesis strategies for its types whenever Hypothesis is installed (the
    # test extra); a broker draws no examples, and the import was a fifth of its start-up.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    from samsa.broker.broker import ShutdownError, StartupError
    from samsa.broker.server import run

    try:
        config = _config(args).validate()
    except ConfigError as exc:
        return _error(str(exc), EXIT_USAGE)
    problem = _unresolvable(config.host, config.port)
    if problem is not None:  # found before the data directory is touched
        return _error(problem, EXIT_RUNTIME)
    try:
        run(config)
    except (StartupError, ShutdownError) as exc:
        return _error(str(exc), EXIT_RUNTIME)
    except OSError as exc:
        return _error(_describe(exc, config), EXIT_RUNTIME)
    return 0


def _config(args: argparse.Namespace) -> BrokerConfig:
    config = BrokerConfig()
    if args.config:
        config = config.with_properties(load_config_file(Path(args.config)))
    for item in args.override or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--override expects KEY=VALUE, got {item!r}")
        config = config.with_properties({key: value})
    adv_host = adv_port = None
    if args.advertised_listener:
        adv_host, adv_port = parse_host_port(args.advertised_listener)
    return config.with_overrides(
        data_dir=Path(args.data_dir) if args.data_dir else None,
        host=args.host,
        port=args.port,
        advertised_host=adv_host,
        advertised_port=adv_port,
    )


def _unresolvable(host: str, port: int) -> str | None:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        return f"cannot resolve listen host {host!r}: {reason}"
    return None


def _describe(exc: OSError, config: BrokerConfig) -> str:
    if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) and not exc.filename:
        reason = {
            errno.EADDRINUSE: "address already in use",
            errno.EADDRNOTAVAIL: "address not available on this machine",
            errno.EACCES: "permission denied",
        }[exc.errno]
        return f"cannot listen on {config.host}:{config.port}: {reason}"
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _error(message: str, status: int) -> int:
    print(f"samsa broker: error: {message}", file=sys.stderr)
    return status


def register(sub: Any) -> None:
    b = sub.add_parser("broker", help="run a broker in the foreground")
    b.add_argument("--data-dir", help="data directory (default ./samsa-data)")
    b.add_argument("--host", help="listen address (default 127.0.0.1)")
    b.add_argument("--port", type=int, help="listen port (default 9092; 0 picks a free one)")
    b.add_argument(
        "--advertised-listener",
        metavar="HOST:PORT",
        help="address given to clients in Metadata (default: the listen address)",
    )
    b.add_argument("--config", metavar="FILE", help="properties file with Kafka-named settings")
    b.add_argument(
        "--override",
        action="append",
        metavar="KEY=VALUE",
        help="a Kafka-named setting, e.g. log.flush.interval.messages=1 (repeatable)",
    )
    b.set_defaults(func=_broker)
