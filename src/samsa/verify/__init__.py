"""``samsa verify``: a Jepsen-style workload under faults, and a checker of its history.

:func:`run_verify` (:mod:`samsa.verify.workload`) runs concurrent client processes (OS
processes, :mod:`samsa.verify._worker`; a client crash is a SIGKILL) that send and poll (in
transactions or not) while faults are injected, then each reads every partition to its end,
and records every operation in a
:class:`History` (:mod:`samsa.verify.history`); :func:`check` (:mod:`samsa.verify.checker`,
pure) finds every anomaly class of Jepsen's Kafka checker in it; :mod:`samsa.verify.report`
prints the table and writes the report directory (history, JSON summary, pictures, HTML).
"""

from samsa.verify.checker import KINDS, Anomaly, CheckResult, allowed_kinds, check
from samsa.verify.history import Fault, History, Op

__all__ = [
    "KINDS",
    "Anomaly",
    "CheckResult",
    "Fault",
    "History",
    "Op",
    "allowed_kinds",
    "check",
]
