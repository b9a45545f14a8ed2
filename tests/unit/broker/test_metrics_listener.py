"""``metrics.listener``: the metrics endpoint listens on the interface of a named listener."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from samsa.broker import server as server_module
from samsa.broker.config import BrokerConfig, ConfigError
from samsa.broker.metrics import metrics_bind_host

LISTENERS = "PLAINTEXT://127.0.0.1:0,INTERNAL://10.1.2.3:0"


def config(tmp_path: Path, **kw: Any) -> BrokerConfig:
    return BrokerConfig(
        data_dir=tmp_path,
        listeners=LISTENERS,
        listener_security_protocol_map="INTERNAL:PLAINTEXT",
        **kw,
    )


def test_the_named_listeners_host_is_picked(tmp_path: Path) -> None:
    assert metrics_bind_host(config(tmp_path, metrics_port=0)) == "127.0.0.1"  # the broker's
    assert metrics_bind_host(config(tmp_path, metrics_port=0, metrics_host="::1")) == "::1"
    named = config(tmp_path, metrics_port=0, metrics_listener="internal").validate()
    assert metrics_bind_host(named) == "10.1.2.3"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"metrics_port": 0, "metrics_listener": "PUBLIC"}, "is not one of the listeners"),
        ({"metrics_listener": "INTERNAL"}, "needs metrics.port"),
        ({"metrics_port": 0, "metrics_listener": "INTERNAL", "metrics_host": "h"}, "not both"),
    ],
)
def test_bad_metrics_listener_is_refused_at_start(
    tmp_path: Path, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **kw).validate()


def test_the_endpoint_binds_the_named_listeners_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server asks for the picked host (captured, so no socket on 10.1.2.3 is opened)."""
    asked: list[tuple[str, int | None]] = []

    class FakeServer:
        sockets = [type("S", (), {"getsockname": lambda self: ("10.1.2.3", 9404)})()]

    async def start_server(cb: Any, host: str, port: int | None, **kw: Any) -> FakeServer:
        asked.append((host, port))
        return FakeServer()

    monkeypatch.setattr(server_module.asyncio, "start_server", start_server)
    cfg = config(tmp_path, metrics_port=9404, metrics_listener="INTERNAL")
    asyncio.run(server_module._MetricsServer.start(None, cfg))  # type: ignore[arg-type]
    assert asked == [("10.1.2.3", 9404)]
