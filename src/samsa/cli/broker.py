"""``samsa broker``: run a broker in the foreground."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from samsa.broker.config import BrokerConfig, ConfigError, load_config_file, parse_host_port


def _broker(args: argparse.Namespace) -> int:
    from samsa.broker.server import run

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
    config = config.with_overrides(
        data_dir=Path(args.data_dir) if args.data_dir else None,
        host=args.host,
        port=args.port,
        advertised_host=adv_host,
        advertised_port=adv_port,
    )
    run(config)
    return 0


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
