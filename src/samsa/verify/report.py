"""Printing a verify result: the anomaly table (zero rows is the goal) and a summary."""

from __future__ import annotations

from samsa.verify.checker import KINDS
from samsa.verify.workload import VerifyResult

EXAMPLES = 3


def anomaly_table(result: VerifyResult, examples: int = EXAMPLES) -> str:
    rows = [(k, result.check.anomalies[k]) for k in KINDS if result.check.anomalies[k]]
    if not rows:
        return "anomalies: none"
    width = max(len("anomaly"), *(len(k) for k, _ in rows))
    lines = [f"{'anomaly':<{width}}  {'count':>6}  examples"]
    lines.append(f"{'-' * width}  {'-' * 6}  {'-' * 40}")
    for kind, found in rows:
        shown = "; ".join(found[:examples]) + ("; ..." if len(found) > examples else "")
        lines.append(f"{kind:<{width}}  {len(found):>6}  {shown}")
    return "\n".join(lines)


def summary_text(result: VerifyResult) -> str:
    s = result.summary()
    parts = [
        f"sent {s['sent']}",
        f"acked {s['acked']}"
        + (f" ({s['acked_without_offset']} without offset)" if s["acked_without_offset"] else ""),
        f"must be read {s['must_read']}",
        f"read {s['read']}",
    ]
    if s["retries"] is not None:
        parts.append(f"produce retries {s['retries']}")
    if result.proxy_stats is not None:
        ps = result.proxy_stats
        parts.append(
            f"faults {ps['faults']} (lost responses {ps['dropped_responses']}, "
            f"resets {ps['resets']}, delayed frames {ps['delayed_frames']})"
        )
    if result.restarts:
        parts.append(f"broker restarts {len(result.restarts)} ({s['restart_failures']} failed)")
    if "txns" in s:
        parts.append("transactions " + ", ".join(f"{k} {v}" for k, v in sorted(s["txns"].items())))
    if s["producer_restarts"]:
        parts.append(f"producers replaced {s['producer_restarts']}")
    if result.send_errors:
        errs = ", ".join(f"{k} x{v}" for k, v in sorted(result.send_errors.items()))
        parts.append(f"client errors {errs}")
    parts.append(f"{s['elapsed_s']}s")
    text = "summary: " + "; ".join(parts)
    for note in result.notes:
        text += f"\nnote: {note}"
    return text


def render(result: VerifyResult) -> str:
    return f"{anomaly_table(result)}\n{summary_text(result)}"
