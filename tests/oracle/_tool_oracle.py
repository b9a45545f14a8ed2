"""Kafka's own command-line tools run against a samsa broker and an Apache Kafka node, the same
command line on both, their output compared once what must differ is normalised away: the
hosts and ports, topic ids, timestamps and durations, member ids, log directories and sizes,
and column widths (the tools pad columns to their longest cell).

Both brokers are node 1, so broker and coordinator ids compare as they are. Each command runs
on both at once, in the process's two tool JVMs (``run_tool_in_process``): a command costs
its own work, not a JVM start.
"""

from __future__ import annotations

import operator
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _broker import BrokerProcess
from samsa.testing.kafka import KafkaNode, run_tool_in_process

# An authorizer on both, the anonymous principal (PLAINTEXT) a super user: kafka-acls works,
# and every other tool is allowed everything.
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}


@dataclass(frozen=True)
class Out:
    """One tool run, normalised: exit code, stdout lines, and stderr's meaningful lines."""

    rc: int
    out: list[str]
    err: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.out)


@dataclass
class Pair:
    samsa: BrokerProcess
    kafka: KafkaNode
    timeout: float = 90.0

    def run(self, tool: str, *args: str, input: str | None = None) -> tuple[Out, Out]:
        """``tool args`` against samsa and against Kafka (``BS`` in ``args`` is each one's
        bootstrap server), normalised."""
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(self._one, bs, tool, args, input)
                for bs in (self.samsa.bootstrap, self.kafka.bootstrap)
            ]
            s, k = (f.result() for f in futures)
        return s, k

    def same(self, tool: str, *args: str, input: str | None = None) -> Out:
        """Run on both and assert the same normalised answer; samsa's is returned."""
        s, k = self.run(tool, *args, input=input)
        assert s == k, f"{tool} {' '.join(args)}\n--- samsa\n{s}\n--- kafka\n{k}"
        return s

    def settled(
        self,
        tool: str,
        *args: str,
        agree: Callable[[Out, Out], bool] = operator.eq,
        tries: int = 4,
    ) -> tuple[Out, Out]:
        """A read run again while the answers disagree: Kafka applies a change through its
        metadata log, so a describe right after it may not show it yet (samsa's shows it at
        once). A lasting difference still shows after ``tries`` runs."""
        for attempt in range(tries):
            s, k = self.run(tool, *args)
            if agree(s, k):
                break
            time.sleep(0.5 * (attempt + 1))
        return s, k

    def same_read(self, tool: str, *args: str) -> Out:
        """:meth:`same` for a read that may follow a change (see :meth:`settled`)."""
        s, k = self.settled(tool, *args)
        assert s == k, f"{tool} {' '.join(args)}\n--- samsa\n{s}\n--- kafka\n{k}"
        return s

    def _one(self, bs: str, tool: str, args: tuple[str, ...], input: str | None) -> Out:
        argv = [bs if a == "BS" else a for a in args]
        r = run_tool_in_process(tool, *argv, input=input, timeout=self.timeout)
        return normalise(r, bs)


_TIMESTAMP = re.compile(r"\b1[6-9]\d{11}\b")  # epoch milliseconds of this century
_LOG_TIME = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] ")
_TOPIC_ID = re.compile(r"TopicId: \S+")
_MEMBER = re.compile(r"\b[\w.-]+-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_LOG_DIR = re.compile(r'"logDir":"[^"]*"')
_SIZE = re.compile(r'"size":\d+')


_SCRAM = re.compile(r"(SCRAM credential configs for user-principal '[^']*' are )(.*)")


def normalise(r: subprocess.CompletedProcess[str], bootstrap: str) -> Out:
    def clean(text: str) -> list[str]:
        text = text.replace(bootstrap, "HOST:PORT")
        text = _TOPIC_ID.sub("TopicId: ID", text)
        text = _MEMBER.sub("MEMBER", text)
        text = _LOG_DIR.sub('"logDir":"DIR"', text)
        text = _SIZE.sub('"size":0', text)
        text = _TIMESTAMP.sub("TS", text)
        # Kafka lists a user's SCRAM mechanisms in hash-map order: compared sorted.
        text = _SCRAM.sub(lambda m: m.group(1) + ", ".join(sorted(m.group(2).split(", "))), text)
        lines = []
        for line in text.splitlines():
            if line.startswith("\tat ") or line.startswith("\t... "):
                continue  # Java stack frames
            line = _LOG_TIME.sub("", line)
            lines.append(re.sub(r"[ \t]+", " ", line).strip())
        return [line for line in lines if line]

    return Out(r.returncode, clean(r.stdout), clean(r.stderr))


def columns(out: Out, header: str) -> list[dict[str, str]]:
    """The rows of a table the tools print with a header line starting with ``header``."""
    rows: list[dict[str, str]] = []
    names: list[str] | None = None
    for line in out.out:
        if line.startswith(header):
            names = line.split(" ")
        elif names is not None:
            rows.append(dict(zip(names, line.split(" "), strict=False)))
    return rows


@contextmanager
def tool_pair(tmp: Path, overrides: dict[str, str] | None = None) -> Iterator[Pair]:
    """A samsa broker and a Kafka node, both node 1 with ``overrides``; stopped on exit."""
    overrides = dict(overrides or {})
    samsa = BrokerProcess(tmp / "samsa", {"node.id": "1", **overrides})
    kafka = KafkaNode(tmp / "kafka", overrides=overrides)
    kafka.launch()  # the JVM starts while samsa does
    try:
        samsa.start(timeout=120)  # a loaded machine imports slowly
        try:
            kafka.wait_serving()
            yield Pair(samsa, kafka)
        finally:
            samsa.stop()
    finally:
        kafka.stop()
