"""``samsa verify`` against Tansu (and, for comparison, samsa): what each broker gets wrong.

Runs the verify workload (samsa's idempotent producers, then read_committed consumers,
then the checker) against a Tansu broker with its in-memory engine:

(1) idempotent, no faults;
(2) idempotent through the fault proxy (lost responses, resets, delays): retries of
    batches the broker already wrote must be recognised as duplicates;
(3) transactional through the proxy, some transactions aborted on purpose (when samsa's
    client has transactions). Tansu is known to return aborted transactional data to
    read_committed consumers (its Fetch lists no aborted transactions), so this run must
    report "aborted data read": a checker that does not see it is broken.
(4) transactional without faults, to tell Tansu's own behaviour from fault effects.

No broker restarts here: Tansu's memory engine loses everything when it stops. With
``--with-samsa`` the same runs go against a samsa broker too (in a temporary data dir).
Each run prints verify's anomaly table and summary, and a final table sums up.

    python benchmarks/verify_tansu.py               # ~1 min (first Tansu start: + install)
    python benchmarks/verify_tansu.py --with-samsa --records 3000
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import BrokerProcess, SamsaBroker, TansuBroker

from samsa.client import Producer
from samsa.verify import VerifyConfig, VerifyResult, render, run_verify


@dataclass
class Run:
    name: str
    transactions: bool
    proxy: bool


RUNS = [
    Run("idempotent", False, False),
    Run("idempotent + faults", False, True),
    Run("transactional + faults", True, True),
    Run("transactional", True, False),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per run")
    parser.add_argument("--with-samsa", action="store_true", help="same runs against samsa")
    args = parser.parse_args()

    has_txn = hasattr(Producer, "init_transactions")
    runs = [r for r in RUNS if has_txn or not r.transactions]
    if not has_txn:
        print("note: samsa's client has no transactions yet: transactional runs skipped\n")

    results: list[tuple[str, str, VerifyResult | str]] = []
    with contextlib.ExitStack() as stack:
        brokers: list[tuple[str, BrokerProcess]] = [("tansu", stack.enter_context(TansuBroker()))]
        if args.with_samsa:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="verify-")))
            brokers.append(("samsa", stack.enter_context(SamsaBroker(tmp / "data"))))
        for broker_name, broker in brokers:
            for run in runs:
                cfg = VerifyConfig(
                    bootstrap=broker.bootstrap,
                    proxy=run.proxy,
                    producers=args.producers,
                    records=args.records,
                    transactions=run.transactions,
                    seed=args.seed,
                    timeout_s=args.timeout_s,
                )
                print(f"=== {broker_name}: {run.name} ===", flush=True)
                try:
                    result = run_verify(cfg, lambda m: print(f"  {m}", flush=True))
                except Exception as exc:  # a broker refusing the workload is a finding too
                    print(f"  failed: {exc!r}\n", flush=True)
                    results.append((broker_name, run.name, repr(exc)))
                    continue
                print(render(result) + "\n", flush=True)
                results.append((broker_name, run.name, result))

    print("=== summary ===")
    print(f"{'broker':<7} {'run':<24} {'sent':>6} {'acked':>6} {'read':>6}  anomalies")
    for broker_name, run_name, r in results:
        if isinstance(r, str):
            print(f"{broker_name:<7} {run_name:<24} {'-':>6} {'-':>6} {'-':>6}  failed: {r}")
            continue
        counts = r.check.counts()
        found = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
        c = r.check
        print(f"{broker_name:<7} {run_name:<24} {c.sent:>6} {c.acked:>6} {c.read:>6}  {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
