"""Reporting a verify run: the terminal table, and ``--report DIR``.

The directory gets ``history.jsonl`` (every operation and fault window), ``summary.json``
(the summary and every anomaly kept, with its operations), pictures drawn with matplotlib
(imported only here, only when a report is asked for): ``latency.png`` (each operation's
latency over time, sends / polls / transactions, by outcome, fault windows shaded),
``throughput.png`` (operations per second by outcome), ``cycle.png`` (the shortest dependency
cycle, when one was found), and ``index.html`` tying them together.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from samsa.verify.checker import KINDS, CheckResult
from samsa.verify.history import FAIL, INFO, OK, History

if TYPE_CHECKING:
    from samsa.verify.workload import VerifyResult

EXAMPLE_CHARS = 160
_FAULT_COLOURS = {"kill": "#d62728", "pause": "#9467bd", "proxy": "#ff7f0e"}


def anomaly_table(check: CheckResult) -> str:
    rows = [k for k in KINDS if check.counts.get(k)]
    if not rows:
        return "anomalies: none"
    width = max(len("anomaly"), *(len(k) for k in rows))
    lines = [f"{'anomaly':<{width}}  {'count':>6}  {'counts?':<7}  example"]
    lines.append(f"{'-' * width}  {'-' * 6}  {'-' * 7}  {'-' * 40}")
    for kind in rows:
        example = check.cases[kind][0].explanation
        if len(example) > EXAMPLE_CHARS:
            example = example[: EXAMPLE_CHARS - 3] + "..."
        verdict = "allowed" if kind in check.allowed else "FAILS"
        lines.append(f"{kind:<{width}}  {check.counts[kind]:>6}  {verdict:<7}  {example}")
    return "\n".join(lines)


def summary_text(result: VerifyResult) -> str:
    s = result.summary()
    parts = [
        s["mode"],
        f"ops {s['ops']} (ok {s['ok']}, fail {s['fail']}, info {s['info']})",
        f"sent {s['sent']} (acked {s['acked']})",
        f"values read {s['values_read']}",
    ]
    if s["crashes"]:
        parts.append(f"client crashes {s['crashes']} (SIGKILL)")
    if s["client_processes"]:
        parts.append(
            f"processes {s['client_processes']}, final reads to the end by {s['final_readers']}"
        )
    windows = s["fault_windows"]
    if windows:
        parts.append("fault windows " + ", ".join(f"{k} {v}" for k, v in sorted(windows.items())))
    ps = result.proxy_stats
    if ps is not None:
        lies = ps["replayed_responses"] + ps["faked_acks"]
        parts.append(
            f"proxy faults {ps['faults']} (lost responses {ps['dropped_responses']}, "
            f"resets {ps['resets']}" + (f", lies {lies}" if lies else "") + ")"
        )
    if s["client_errors"]:
        errs = sorted(s["client_errors"].items(), key=lambda kv: -kv[1])[:4]
        parts.append("client errors " + ", ".join(f"{k} x{v}" for k, v in errs))
    parts.append(f"{s['elapsed_s']}s")
    verdict = "valid" if result.ok else "INVALID: " + ", ".join(result.check.bad_kinds)
    text = f"result: {verdict}\nsummary: " + "; ".join(parts)
    for note in result.notes:
        text += f"\nnote: {note}"
    return text


def render(result: VerifyResult) -> str:
    return f"{anomaly_table(result.check)}\n{summary_text(result)}"


# --- the report directory --------------------------------------------------------------------


def write_report(directory: str | Path, result: VerifyResult) -> list[Path]:
    """Write the history, the summary and the pictures; returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "history.jsonl", out / "summary.json"]
    result.history.save(written[0])
    data = {"summary": result.summary(), "notes": result.notes, **result.check.to_json()}
    written[1].write_text(json.dumps(data, indent=2, default=str))
    written += _pictures(out, result.history, result.check)
    page = out / "index.html"
    page.write_text(_html(result, [p.name for p in written if p.suffix == ".png"]))
    written.append(page)
    return written


def _pictures(out: Path, history: History, check: CheckResult) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    files = []
    ops = list(history.client_ops())
    end = max([o.end for o in ops] + [f.end for f in history.faults] + [1.0])

    def shade(ax: Any) -> None:
        labelled: set[str] = set()
        for fl in history.faults:
            colour = _FAULT_COLOURS.get(fl.kind, "#7f7f7f")
            label = None if fl.kind in labelled else f"fault: {fl.kind}"
            labelled.add(fl.kind)
            ax.axvspan(
                fl.start, max(fl.end, fl.start + 0.05), color=colour, alpha=0.15, label=label
            )

    fig, ax = plt.subplots(figsize=(10, 4.5))
    shade(ax)
    markers = {"send": "^", "poll": "o", "txn": "s"}
    colours = {OK: "#2ca02c", INFO: "#ff7f0e", FAIL: "#d62728"}
    for f, marker in markers.items():
        for kind, colour in colours.items():
            pts = [
                (o.start, max(o.end - o.start, 1e-4)) for o in ops if o.f == f and o.type == kind
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=8, marker=marker, c=colour, alpha=0.6, label=f"{f} {kind}")
    ax.set_yscale("log")
    ax.set_xlim(0, end)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (s)")
    ax.set_title("operation latency")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    files.append(out / "latency.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 3.5))
    shade(ax)
    buckets = max(1, math.ceil(end))
    for kind, colour in colours.items():
        counts = [0] * buckets
        for o in ops:
            if o.type == kind:
                counts[min(buckets - 1, int(o.end))] += 1
        ax.plot([i + 0.5 for i in range(buckets)], counts, color=colour, label=kind)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("operations / s")
    ax.set_title("throughput")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    files.append(out / "throughput.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    cycle = check.shortest_cycle()
    if cycle is not None:
        files.append(out / "cycle.png")
        _draw_cycle(plt, cycle.kind, cycle.data["steps"], history, files[-1])
    return files


def _draw_cycle(
    plt: Any, kind: str, steps: list[dict[str, Any]], history: History, path: Path
) -> None:
    by_index = {o.index: o for o in history.ops}
    nodes = [s["from"] for s in steps]
    n = len(nodes)
    pos = {
        x: (
            math.cos(2 * math.pi * i / n + math.pi / 2),
            math.sin(2 * math.pi * i / n + math.pi / 2),
        )
        for i, x in enumerate(nodes)
    }
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    colours = {"ww": "#1f77b4", "wr": "#2ca02c", "rw": "#d62728", "process": "#9467bd"}
    for s in steps:
        (x0, y0), (x1, y1) = pos[s["from"]], pos[s["to"]]
        ax.annotate(
            "",
            xy=(x1 * 0.82, y1 * 0.82),
            xytext=(x0 * 0.82, y0 * 0.82),
            arrowprops={
                "arrowstyle": "->",
                "color": colours.get(s["rel"], "#7f7f7f"),
                "lw": 2,
                "connectionstyle": "arc3,rad=0.25",  # a 2-cycle's arrows stay apart
            },
        )
        # the label beside the arc: the chord's middle, pushed off to the arc's side
        mx, my, dx, dy = (x0 + x1) * 0.41, (y0 + y1) * 0.41, x1 - x0, y1 - y0
        ax.text(mx + dy * 0.18, my - dx * 0.18, s["rel"], ha="center", fontsize=9)
    for x, (px, py) in pos.items():
        o = by_index.get(x)
        label = f"op {x}" + (f"\np{o.process} {o.f} {o.type}" if o is not None else "")
        ax.text(
            px,
            py,
            label,
            ha="center",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round", "fc": "#f0f0f0"},
        )
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.axis("off")
    ax.set_title(f"shortest cycle: {kind}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _html(result: VerifyResult, pictures: list[str]) -> str:
    esc = html.escape
    check = result.check
    rows = []
    for kind in KINDS:
        if not check.counts.get(kind):
            continue
        examples = "".join(
            f"<li>{esc(a.explanation)} <small>(ops {esc(str(a.ops))})</small></li>"
            for a in check.cases[kind][:5]
        )
        verdict = "allowed" if kind in check.allowed else "<b>fails</b>"
        rows.append(
            f"<tr><td>{esc(kind)}</td><td>{check.counts[kind]}</td><td>{verdict}</td>"
            f"<td><ul>{examples}</ul></td></tr>"
        )
    table = (
        "<table><tr><th>anomaly</th><th>count</th><th></th><th>examples</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else "<p>No anomaly.</p>"
    )
    summary = "".join(
        f"<tr><td>{esc(str(k))}</td><td>{esc(json.dumps(v, default=str))}</td></tr>"
        for k, v in result.summary().items()
    )
    images = "".join(f'<h2>{esc(p[:-4])}</h2><img src="{esc(p)}" alt="{esc(p)}">' for p in pictures)
    verdict = "valid" if result.ok else "INVALID: " + ", ".join(check.bad_kinds)
    notes = "".join(f"<li>{esc(n)}</li>" for n in result.notes)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>samsa verify: {esc(result.topic)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px;vertical-align:top;
text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>samsa verify: {esc(verdict)}</h1>
<h2>anomalies</h2>{table}
<h2>summary</h2><table>{summary}</table><ul>{notes}</ul>
{images}
<p>Every operation: <a href="history.jsonl">history.jsonl</a>; everything above as JSON:
<a href="summary.json">summary.json</a>.</p>
</body></html>
"""
