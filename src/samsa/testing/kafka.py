"""Apache Kafka, run beside samsa: the oracle of the conformance tests and the first peer of the
benchmarks.

The project pins one Kafka release in ``kafka/pom.xml``; ``make kafka`` (and so ``make test``)
resolves it from Maven Central into a cache outside the repository and writes the classpath to
``classpath_file()``. This module only reads that file: it never downloads anything.

:class:`KafkaNode` is one KRaft node (combined broker + controller) on free ports of 127.0.0.1,
its storage formatted before the first start. :class:`KafkaCluster` is three (or N) such nodes
sharing one controller quorum. Both start, SIGKILL, SIGSTOP/SIGCONT, restart and stop their
processes, and log each node's start-up time and resident memory. A cluster also says where
things are (a partition's leader and leader epoch from Metadata, a group's or transactional
id's coordinator from FindCoordinator) and makes the faults tests need: a leader or a
coordinator SIGKILLed until another node takes over, then restarted; a leader SIGSTOPped past
its session (a zombie once resumed); and :meth:`KafkaCluster.fault_command`, a shell command
running such a fault in this process (for ``samsa verify --restart-broker``).

Broker settings are passed as in samsa's fixtures: a dict of ``key: value`` overrides, given to
``kafka.Kafka`` as ``--override k=v``.

Why a node is "serving": Kafka prints ``Kafka Server started`` once its broker side has
registered with the controller and is unfenced; for a cluster we also wait until a Metadata
request lists every node, since clients route by it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "FAST_FAILOVER",
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaNode",
    "KafkaNotInstalled",
    "class_archive",
    "classpath",
    "classpath_file",
    "run_tool",
    "run_tool_in_process",
    "tool_args",
]

log = logging.getLogger(__name__)

# Must match <kafka.version> in kafka/pom.xml (tests/unit/test_kafka_launcher.py checks).
KAFKA_VERSION = "4.4.0"

# Failure detection tuned short for fault tests (Kafka's defaults are 9 s, 2 s and 30 s): a
# SIGKILLed or SIGSTOPped node loses its leaderships within ~1.5 s, a stalled follower the ISR
# within 3 s.
FAST_FAILOVER: dict[str, str] = {
    "broker.session.timeout.ms": "1500",
    "broker.heartbeat.interval.ms": "250",
    "replica.lag.time.max.ms": "3000",
}

# The tools a Kafka user runs, by the names of their shell scripts in Kafka's distribution.
TOOLS: dict[str, str] = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-client-metrics": "org.apache.kafka.tools.ClientMetricsCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "kafka-verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "kafka-verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "kafka-transactional-message-copier": "org.apache.kafka.tools.TransactionalMessageCopier",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-e2e-latency": "org.apache.kafka.tools.EndToEndLatency",
    "kafka-storage": "kafka.tools.StorageTool",
}

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="server" fileName="{path}" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="INFO"/>
    <Logger name="org.apache.kafka" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Root level="WARN"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
"""

_TOOLS_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="ERROR">
  <Appenders><Console name="err" target="SYSTEM_ERR">
    <PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="ERROR"><AppenderRef ref="err"/></Root></Loggers>
</Configuration>
"""


# A JVM that runs Kafka's tools one after another, each through its main() on a thread of
# its own, so a test issuing dozens of tool commands pays one JVM start instead of one per
# command. Kafka's tools leave through Exit.exit, which Kafka lets a caller replace: here it
# ends the command with that code, and what the command prints afterwards is dropped, as a
# JVM that exits prints nothing more. The shutdown hooks a command registers run when it
# ends, as the JVM's would at exit. Requests and answers are length-prefixed on stdin/stdout.
_TOOL_SERVER_JAVA = """
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.lang.reflect.Field;
import java.util.*;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.common.utils.internals.Exit;

public final class SamsaToolServer {
    static final class Exited extends Error {
        Exited() { super(null, null, false, false); }
    }

    /** System.out/err: what the running command writes goes to its buffer. */
    static final class Sink extends OutputStream {
        volatile OutputStream to = OutputStream.nullOutputStream();
        volatile Thread muted;  // the command's thread once it called Exit.exit
        private boolean live() { return Thread.currentThread() != muted; }
        @Override public void write(int b) throws IOException { if (live()) to.write(b); }
        @Override public void write(byte[] b, int off, int len) throws IOException {
            if (live()) to.write(b, off, len);
        }
    }

    static final class Source extends InputStream {
        volatile InputStream from = InputStream.nullInputStream();
        @Override public int read() throws IOException { return from.read(); }
        @Override public int read(byte[] b, int off, int len) throws IOException {
            return from.read(b, off, len);
        }
        @Override public int available() throws IOException { return from.available(); }
    }

    // The clients number their default client ids per JVM (adminclient-1, ...), and the
    // tools print them: each command starts from a fresh JVM's numbers.
    static final String[][] SEQUENCES = {
        {"org.apache.kafka.clients.admin.KafkaAdminClient", "ADMIN_CLIENT_ID_SEQUENCE"},
        {"org.apache.kafka.clients.producer.ProducerConfig", "PRODUCER_CLIENT_ID_SEQUENCE"},
        {"org.apache.kafka.clients.consumer.ConsumerConfig", "CONSUMER_CLIENT_ID_SEQUENCE"},
    };
    static final Map<AtomicInteger, Integer> FRESH = new HashMap<>();

    static final Sink OUT = new Sink(), ERR = new Sink();
    static volatile Integer code;
    static final List<Runnable> hooks = Collections.synchronizedList(new ArrayList<>());

    public static void main(String[] ignored) throws Exception {
        var req = new DataInputStream(
            new BufferedInputStream(new FileInputStream(FileDescriptor.in)));
        var resp = new DataOutputStream(
            new BufferedOutputStream(new FileOutputStream(FileDescriptor.out)));
        Source in = new Source();
        System.setOut(new PrintStream(OUT, true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(ERR, true, StandardCharsets.UTF_8));
        System.setIn(in);
        Exit.Procedure leave = (status, message) -> {
            if (code == null) code = status;
            OUT.muted = ERR.muted = Thread.currentThread();
            throw new Exited();
        };
        Exit.setExitProcedure(leave);
        Exit.setHaltProcedure(leave);
        Exit.setShutdownHookAdder((name, hook) -> hooks.add(hook));
        for (String[] f : SEQUENCES) {
            Field field = Class.forName(f[0]).getDeclaredField(f[1]);
            field.setAccessible(true);
            AtomicInteger sequence = (AtomicInteger) field.get(null);
            FRESH.put(sequence, sequence.get());
        }
        while (true) {
            int argc;
            try {
                argc = req.readInt();
            } catch (EOFException eof) {
                return;
            }
            String[] argv = new String[argc];
            for (int i = 0; i < argc; i++) argv[i] = new String(bytes(req), StandardCharsets.UTF_8);
            var out = new ByteArrayOutputStream();
            var err = new ByteArrayOutputStream();
            in.from = new ByteArrayInputStream(bytes(req));
            OUT.to = out;
            ERR.to = err;
            int rc = run(argv);
            System.out.flush();
            System.err.flush();
            OUT.to = ERR.to = OutputStream.nullOutputStream();
            OUT.muted = ERR.muted = null;
            resp.writeInt(rc);
            resp.writeInt(out.size());
            out.writeTo(resp);
            resp.writeInt(err.size());
            err.writeTo(resp);
            resp.flush();
        }
    }

    static byte[] bytes(DataInputStream in) throws IOException {
        byte[] b = new byte[in.readInt()];
        in.readFully(b);
        return b;
    }

    static int run(String[] argv) throws InterruptedException {
        code = null;
        hooks.clear();
        FRESH.forEach(AtomicInteger::set);
        Throwable[] failed = {null};
        Thread t = new Thread(() -> {
            try {
                Class.forName(argv[0]).getMethod("main", String[].class)
                    .invoke(null, (Object) Arrays.copyOfRange(argv, 1, argv.length));
            } catch (java.lang.reflect.InvocationTargetException e) {
                if (code == null) failed[0] = e.getCause();
            } catch (Exited e) {
                // Exit.exit: the code is set
            } catch (Throwable e) {
                failed[0] = e;
            }
        }, "main");
        t.start();
        t.join();
        if (failed[0] != null && code == null) {  // as the JVM reports an uncaught exception
            System.err.print("Exception in thread \\"main\\" ");
            failed[0].printStackTrace();
            return 1;
        }
        for (Runnable hook : new ArrayList<>(hooks)) {
            try { hook.run(); } catch (Throwable e) { /* a failed hook leaves the exit code */ }
        }
        return code == null ? 0 : code;
    }
}
"""


class KafkaNotInstalled(RuntimeError):
    """The pinned Kafka has not been resolved: run ``make kafka`` (``make test`` does)."""


def cache_dir() -> Path:
    """Where ``make kafka`` keeps the resolved classpath (outside the repository)."""
    base = os.environ.get("SAMSA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "samsa"
    )
    return Path(base) / f"kafka-{KAFKA_VERSION}"


def classpath_file() -> Path:
    return cache_dir() / "classpath.txt"


def classpath() -> str:
    """The Java classpath of the pinned Kafka broker, tools and client."""
    path = classpath_file()
    try:
        cp = path.read_text().strip()
    except FileNotFoundError:
        raise KafkaNotInstalled(
            f"Apache Kafka {KAFKA_VERSION} is not resolved ({path} is missing); run `make kafka`"
        ) from None
    missing = [j for j in cp.split(os.pathsep) if j and not os.path.exists(j)]
    if missing:
        raise KafkaNotInstalled(f"{len(missing)} jars of {path} are gone (e.g. {missing[0]})")
    if shutil.which("java") is None:
        raise KafkaNotInstalled("`java` is not on the PATH; run `make kafka`")
    return cp


def _tools_log_config() -> Path:
    path = cache_dir() / "tools-log4j2.xml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_TOOLS_LOG4J2_XML)
    return path


def tool_args(tool: str, *args: str, heap: str = "256m") -> list[str]:
    """The command line of a Kafka tool, named as its script (``kafka-topics``) or main class."""
    main = TOOLS.get(tool, tool)
    return [
        "java",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # tools are short-lived: start fast rather than run fast
        f"-Dlog4j2.configurationFile={_tools_log_config()}",
        "-cp",
        classpath(),
        main,
        *args,
    ]


def run_tool(
    tool: str, *args: str, timeout: float = 120.0, input: str | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka tool to completion; stdout and stderr are captured as text."""
    return subprocess.run(
        tool_args(tool, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        check=check,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


class ToolServer:
    """One JVM running Kafka tool commands in turn (see ``_TOOL_SERVER_JAVA``); started on
    the first command. A command that outlives its timeout takes the JVM down with it, and
    the next command starts a fresh one."""

    def __init__(self, heap: str = "256m") -> None:
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        argv = tool_args("SamsaToolServer", heap=self.heap)
        cp = argv.index("-cp") + 1
        argv[cp] = f"{_compiled_tool_server()}{os.pathsep}{argv[cp]}"
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(
        self, tool: str, *args: str, timeout: float = 120.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        argv = [TOOLS.get(tool, tool), *args]
        frames = [struct.pack(">i", len(argv))]
        for part in [*argv, input or ""]:
            data = part.encode()
            frames += [struct.pack(">i", len(data)), data]
        deadline = time.monotonic() + timeout
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"".join(frames))
            self.proc.stdin.flush()
            (rc,) = struct.unpack(">i", self._read(4, deadline))
            out = self._read(struct.unpack(">i", self._read(4, deadline))[0], deadline)
            err = self._read(struct.unpack(">i", self._read(4, deadline))[0], deadline)
        except TimeoutError:
            self.close()
            raise subprocess.TimeoutExpired(["kafka-tool", tool, *args], timeout) from None
        except (OSError, EOFError):
            self.close()
            raise
        return subprocess.CompletedProcess(
            ["kafka-tool", tool, *args], rc, out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
        )  # fmt: skip

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks: list[bytes] = []
        while n > 0:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise EOFError("the Kafka tool server exited")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _compiled_tool_server() -> Path:
    """The tool server's class directory, compiled once per machine and source (a source
    launch would compile it again in every JVM)."""
    digest = hashlib.sha256(_TOOL_SERVER_JAVA.encode()).hexdigest()[:12]
    classes = cache_dir() / f"tool-server-{digest}"
    if classes.exists():
        return classes
    work = Path(tempfile.mkdtemp(prefix="tool-server-", dir=cache_dir()))
    try:
        (work / "SamsaToolServer.java").write_text(_TOOL_SERVER_JAVA)
        subprocess.run(
            ["javac", "-cp", classpath(), "-d", str(work / "classes"),
             str(work / "SamsaToolServer.java")],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        with contextlib.suppress(OSError):  # another process got there first: same classes
            os.rename(work / "classes", classes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return classes


# Two servers at most per process: a tool oracle runs each command on two brokers at once.
_idle_servers: list[ToolServer] = []
_servers_lock = threading.Lock()
_server_slots = threading.BoundedSemaphore(2)


@atexit.register
def _close_tool_servers() -> None:
    with _servers_lock:
        for server in _idle_servers:
            server.close()


def run_tool_in_process(
    tool: str, *args: str, timeout: float = 120.0, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """As :func:`run_tool`, but in one of this process's tool JVMs (one per concurrent
    caller, kept for the next command). For the tools that run a command and exit (the
    admin tools, the console producer and consumer, kafka-storage), not for those that
    leave threads running (the verifiable clients, the perf tests)."""
    with _server_slots:
        with _servers_lock:
            server = _idle_servers.pop() if _idle_servers else ToolServer()
        try:
            return server.run(tool, *args, timeout=timeout, input=input)
        finally:
            with _servers_lock:
                _idle_servers.append(server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class KafkaNode:
    """One KRaft node, broker and controller in one JVM, on 127.0.0.1.

    The ports stay fixed across restarts, so clients and the other nodes find it again.
    """

    # JVM options of nodes made without ``jvm_args`` (the test suite sets C1-only JIT).
    default_jvm_args: ClassVar[tuple[str, ...]] = ()
    # Map the classes a node loads from a class-data-sharing archive (see
    # :func:`class_archive`): about half a node's start. Off by default, as the benchmarks
    # time Kafka's start as its users see it; the test suite turns it on.
    share_classes: ClassVar[bool] = False

    def __init__(
        self,
        data_dir: Path,
        *,
        node_id: int = 1,
        port: int = 0,
        controller_port: int = 0,
        cluster_id: str | None = None,
        voters: str | None = None,
        overrides: Mapping[str, str] | None = None,
        heap: str = "512m",
        jvm_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.node_id = node_id
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.cluster_id = cluster_id or _random_cluster_id()
        self.voters = voters or f"{node_id}@127.0.0.1:{self.controller_port}"
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.jvm_args = list(jvm_args) or list(self.default_jvm_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0  # seconds from exec to "Kafka Server started", last start
        self.rss_mb = 0.0  # resident memory when it started serving
        self._formatted = False
        self._serving: subprocess.Popen[bytes] | None = None
        self._archive_args: list[str] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def server_log(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def properties(self) -> dict[str, str]:
        """The node's server.properties, before the overrides (which Kafka applies on top).

        A single node keeps Kafka's defaults wherever it can, so that it answers as a fresh
        Kafka does (DescribeConfigs shows DEFAULT sources); a cluster adds replication.
        """
        replicas = len(self.voters.split(","))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "group.initial.rebalance.delay.ms": "0",
        }
        rf, isr = str(replicas), str(min(replicas, 2))
        props |= {
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
        }
        if replicas > 1:
            props |= {
                "default.replication.factor": rf,
                "min.insync.replicas": isr,
                "unclean.leader.election.enable": "false",
                "auto.leader.rebalance.enable": "false",
            }
        return props

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.data_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(path=self.server_log))
        return path

    def format(self) -> None:
        """Format the node's storage with the cluster id (once; a restart keeps its data)."""
        config = self._write_config()
        if (self.log_dir / "meta.properties").exists():
            self._formatted = True
            return
        # "--cluster-id=": a random id may begin with "-", which argparse takes for an option.
        result = run_tool_in_process(
            "kafka-storage", "format", f"--cluster-id={self.cluster_id}", "-c", str(config),
            "--ignore-formatted", timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed:\n{result.stdout}\n{result.stderr}")
        self._formatted = True

    def command(self) -> list[str]:
        config = self._write_config()
        cmd = [
            "java",
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            *self.jvm_args,
            *self._archive_args,
            "-cp",
            classpath(),
            "kafka.Kafka",
            str(config),
        ]
        for key, value in self.overrides.items():
            cmd += ["--override", f"{key}={value}"]
        return cmd

    def launch(self) -> KafkaNode:
        """Start the JVM without waiting for it to serve (see :meth:`wait_serving`)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"kafka node {self.node_id} is already running")
        if not self._formatted:
            self.format()
        if self.share_classes and not self._archive_args:
            archive = class_archive()
            self._archive_args = [f"-XX:SharedArchiveFile={archive}"] if archive else []
        self._mark = self.server_log.stat().st_size if self.server_log.exists() else 0
        self._t0 = time.monotonic()
        out = open(self.data_dir / "stdout.log", "ab")  # the child keeps its own copy
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            out.close()
        return self

    def wait_serving(self, timeout: float = 90.0) -> KafkaNode:
        """Wait for ``Kafka Server started`` in this start's part of the log."""
        deadline = time.monotonic() + timeout
        proc = self.proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"kafka node {self.node_id} exited with {proc.returncode}:\n{self.tail()}"
                )
            if "Kafka Server started" in self._log_since_start():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kafka node {self.node_id} did not start:\n{self.tail()}")
            time.sleep(0.05)
        self.started_s = time.monotonic() - self._t0
        self.rss_mb = _rss_mb(proc.pid)
        self._serving = proc
        log.info(
            "kafka node %d (pid %d) serving on %s after %.2f s, RSS %.0f MB",
            self.node_id, proc.pid, self.bootstrap, self.started_s, self.rss_mb,
        )  # fmt: skip
        return self

    def start(self, timeout: float = 90.0) -> KafkaNode:
        return self.launch().wait_serving(timeout)

    def _log_since_start(self) -> str:
        try:
            with open(self.server_log, "rb") as f:
                f.seek(self._mark)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = ""
        for name in ("server.log", "stdout.log"):
            p = self.data_dir / name
            if p.exists():
                text += f"--- {name}\n" + "\n".join(
                    p.read_text("utf-8", "replace").splitlines()[-lines:]
                )
        return text

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def serving(self) -> bool:
        """The running process has said it serves (see :meth:`wait_serving`)."""
        return self.alive() and self._serving is self.proc

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, leadership moves only when the session times out."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def pause(self) -> None:
        """SIGSTOP: the node keeps its sockets but answers nothing (a zombie once resumed)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL if it does not exit in time."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def restart(self, timeout: float = 90.0) -> KafkaNode:
        self.kill()
        return self.start(timeout)

    def __enter__(self) -> KafkaNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KafkaCluster:
    """N KRaft nodes (each broker + controller) forming one cluster on 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path,
        size: int = 3,
        *,
        overrides: Mapping[str, str] | None = None,
        heap: str = "512m",
    ) -> None:
        self.data_dir = Path(data_dir)
        cluster_id = _random_cluster_id()
        ports = [(free_port(), free_port()) for _ in range(size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        self.nodes = [
            KafkaNode(
                self.data_dir / f"node{i + 1}",
                node_id=i + 1,
                port=p,
                controller_port=c,
                cluster_id=cluster_id,
                voters=voters,
                overrides=overrides,
                heap=heap,
            )
            for i, (p, c) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        # Formatting is a JVM each: do them in parallel, then start every node before waiting,
        # since a quorum of controllers must be up before any broker can register.
        threads = [threading.Thread(target=n.format) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for n in self.nodes:
            n.launch()
        try:
            for n in self.nodes:
                n.wait_serving(timeout)
            self.wait_brokers(len(self.nodes), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def live(self) -> list[KafkaNode]:
        return [n for n in self.nodes if n.alive()]

    def _ask(self, api: int, version: int, request: object) -> Any:
        """Send one request to the first live node that answers (a paused one does not)."""
        from samsa.client._connection import BlockingConnection

        last: Exception | None = None
        for n in self.live():
            try:
                with BlockingConnection("127.0.0.1", n.port, timeout=3) as conn:
                    return conn.request(api, version, request)
            except OSError as exc:
                last = exc
        raise RuntimeError(f"no node of the cluster answered: {last}")

    def _metadata(self, topics: Sequence[str] | None) -> Any:
        from samsa.protocol.messages import ApiKey, make_request

        wanted = (
            None
            if topics is None
            else tuple(
                make_request(ApiKey.METADATA, 12, "MetadataRequestTopic", name=t, topic_id=None)
                for t in topics
            )
        )
        req = make_request(
            ApiKey.METADATA, 12, "MetadataRequest", topics=wanted,
            allow_auto_topic_creation=False, include_topic_authorized_operations=False,
        )  # fmt: skip
        return self._ask(ApiKey.METADATA, 12, req)

    def wait_brokers(self, count: int, timeout: float = 60.0) -> None:
        """Wait until a Metadata request names ``count`` live brokers."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if len(self._metadata(()).brokers) >= count:
                    return
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not show {count} brokers in {timeout} s")
            time.sleep(0.1)

    def leaders(self, topic: str) -> dict[int, tuple[int, int]]:
        """partition -> (leader node id, leader epoch), as the controller last told the
        brokers (-1 for a partition without a leader)."""
        resp = self._metadata([topic])
        (t,) = resp.topics
        if t.error_code:
            raise RuntimeError(f"metadata of {topic}: error {t.error_code}")
        return {int(p.partition_index): (int(p.leader_id), int(p.leader_epoch))
                for p in t.partitions}  # fmt: skip

    def leader(self, topic: str, partition: int = 0) -> tuple[int, int]:
        """(leader node id, leader epoch) of one partition."""
        return self.leaders(topic)[partition]

    def coordinator(self, key: str, *, transaction: bool = False, timeout: float = 30.0) -> int:
        """The node coordinating a group id (or, with ``transaction``, a transactional id);
        waits while the coordinator is not available (its internal topic being made, or
        its leader moving)."""
        from samsa.protocol.messages import ApiKey, make_request

        req = make_request(
            ApiKey.FIND_COORDINATOR, 4, "FindCoordinatorRequest", key="",
            key_type=1 if transaction else 0, coordinator_keys=(key,),
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            (c,) = self._ask(ApiKey.FIND_COORDINATOR, 4, req).coordinators
            if not c.error_code and self.node(int(c.node_id)).alive():
                return int(c.node_id)
            if time.monotonic() > deadline:
                raise RuntimeError(f"FindCoordinator {key!r}: error {c.error_code}")
            time.sleep(0.1)

    def kill_coordinator(
        self, key: str, *, transaction: bool = False, wait: bool = True
    ) -> tuple[int, int]:
        """SIGKILL the node coordinating ``key``, wait until another node does, and start
        the killed node again (as :meth:`kill_leader`). Returns (old, new coordinator)."""
        old = self.coordinator(key, transaction=transaction)
        node = self.node(old)
        node.kill()
        deadline = time.monotonic() + 30
        while (new := self.coordinator(key, transaction=transaction)) == old:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator of {key!r} did not move from {old}")
            time.sleep(0.05)
        node.launch()
        if wait:
            self.wait_all()
        return old, new

    def wait_leader(
        self, topic: str, partition: int, moved_from: tuple[int, int], timeout: float = 30.0
    ) -> tuple[int, int]:
        """Wait until the partition has a live leader with an epoch past ``moved_from``'s."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.leader(topic, partition)
            if now[0] > 0 and now[1] > moved_from[1] and self.node(now[0]).alive():
                return now
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}-{partition} still led by {now} after {timeout} s")
            time.sleep(0.05)

    def wait_in_sync(self, topic: str, timeout: float = 60.0) -> None:
        """Wait until every replica of every partition of ``topic`` is in the ISR again
        (a restarted node has caught up), so that the next fault loses no quorum."""
        deadline = time.monotonic() + timeout
        while True:
            (t,) = self._metadata([topic]).topics
            if t.partitions and all(len(p.isr_nodes) == len(p.replica_nodes) for p in t.partitions):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} not back in sync after {timeout} s")
            time.sleep(0.1)

    def kill_leader(
        self, topic: str, partition: int = 0, *, wait: bool = True
    ) -> tuple[int, int, int, int]:
        """SIGKILL the partition's leader, wait until another node leads with a new epoch,
        and start the killed node again (``wait=False``: without waiting for it to serve;
        :meth:`wait_all` does). Returns (old leader, old epoch, new leader, new epoch)."""
        old = self.leader(topic, partition)
        node = self.node(old[0])
        node.kill()
        new = self.wait_leader(topic, partition, old)
        node.launch()
        if wait:
            self.wait_all()
        return (*old, *new)

    def wait_all(self, timeout: float = 300.0) -> None:
        """Wait until every node serves (those launched and not yet serving included)."""
        for n in self.nodes:
            if not n.alive():
                n.launch()
            if not n.serving:
                n.wait_serving(timeout)
        self.wait_brokers(len(self.nodes), timeout)

    def pause_leader(
        self, topic: str, partition: int = 0, *, timeout: float = 30.0
    ) -> tuple[int, int, int, int]:
        """SIGSTOP the partition's leader until the controller fences it and elects
        another (its session timed out), then SIGCONT it: a zombie leader that wakes up
        believing it still leads. Returns (old leader, old epoch, new, new epoch)."""
        old = self.leader(topic, partition)
        node = self.node(old[0])
        node.pause()
        try:
            new = self.wait_leader(topic, partition, old, timeout)
        finally:
            node.resume()
        return (*old, *new)

    @contextmanager
    def fault_command(self, action: Callable[[], object]) -> Iterator[str]:
        """A shell command that runs ``action`` in this process, prints what it returned
        (unless None) and exits 0 when it is done (1 if it raised): how ``samsa verify
        --restart-broker`` kills a leader of a cluster whose processes this object holds,
        and how ``--pause-broker`` learns the pid of the leader of the moment."""
        server = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def serve() -> None:
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                with conn:
                    try:
                        out = action()
                        conn.sendall(b"ok" + (b"" if out is None else str(out).encode()))
                    except Exception as exc:
                        log.warning("fault command failed: %s", exc)
                        conn.sendall(b"failed")

        thread = threading.Thread(target=serve, name="kafka-fault-command", daemon=True)
        thread.start()
        port = server.getsockname()[1]
        code = (
            f"import socket,sys;s=socket.create_connection(('127.0.0.1',{port}));"
            "a=s.recv(4096);print(a[2:].decode());sys.exit(0 if a[:2]==b'ok' else 1)"
        )
        try:
            yield f'{shlex.quote(sys.executable)} -c "{code}"'
        finally:
            stop.set()
            thread.join(5)
            server.close()

    def stop(self) -> None:
        threads = [threading.Thread(target=n.stop) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _class_archive_path() -> Path:
    # An archive holds only for the JVM build and classpath that wrote it.
    java = os.path.realpath(shutil.which("java") or "java")
    key = f"{java}:{os.stat(java).st_mtime_ns}:{classpath()}"
    return cache_dir() / f"kafka-node-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


_archive_lock = threading.Lock()


def class_archive(timeout: float = 300.0) -> Path | None:
    """The JDK's class-data-sharing archive of the classes a Kafka node loads up to serving,
    written once per machine by a node started and stopped for it (a JVM writes the
    archive as it exits). While another process writes it, None: start without."""
    path = _class_archive_path()
    if path.exists():
        return path
    with _archive_lock:
        if path.exists():
            return path
        with open(path.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            if path.exists():
                return path
            with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
                dump = Path(tmp) / "classes.jsa"
                node = KafkaNode(
                    Path(tmp) / "node",
                    jvm_args=[*KafkaNode.default_jvm_args, f"-XX:ArchiveClassesAtExit={dump}"],
                )
                node.share_classes = False
                node.start(timeout)
                node.stop(timeout)  # the archive is written at exit: seconds
                if not dump.exists():
                    log.warning("kafka node exited without a class archive:\n%s", node.tail())
                    return None
                os.replace(dump, path)
        log.info("kafka class archive written to %s", path)
        return path


def _random_cluster_id() -> str:
    # Kafka's cluster ids are a UUID's 16 bytes in URL-safe base64 without padding.
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
