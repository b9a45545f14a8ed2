"""``samsa verify``: fault injection and an exactly-once checker for Kafka-compatible brokers.

:func:`run_verify` runs the workload (:mod:`samsa.verify.workload`) and judges it with the
pure checker (:mod:`samsa.verify.checker`); :func:`render` prints the anomaly table and the
summary (:mod:`samsa.verify.report`).
"""

from samsa.verify.checker import (
    KINDS,
    CheckResult,
    History,
    Outcome,
    Read,
    Sent,
    check,
)
from samsa.verify.report import anomaly_table, render, summary_text
from samsa.verify.workload import VerifyConfig, VerifyError, VerifyResult, run_verify

__all__ = [
    "KINDS",
    "CheckResult",
    "History",
    "Outcome",
    "Read",
    "Sent",
    "VerifyConfig",
    "VerifyError",
    "VerifyResult",
    "anomaly_table",
    "check",
    "render",
    "run_verify",
    "summary_text",
]
