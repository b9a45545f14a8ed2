"""The sync Producer's per-record path: what produce() leaves to the loop thread, and when."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

_FRESH = """
import sys
from samsa.client import Producer
from samsa.client import _accumulator
assert "pyarrow" not in sys.modules, "pyarrow loaded before the producer"
p = Producer({"bootstrap.servers": sys.argv[1]})
print(_accumulator.columnar_ready(), "pyarrow" in sys.modules)
p.close()
"""


def test_producer_returns_with_the_columnar_codec_loaded(shared_broker: Any) -> None:
    # A fresh interpreter: the codec's import (pyarrow) must be over when Producer() returns,
    # not run behind the first produce() calls, fighting them for the GIL.
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, shared_broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
