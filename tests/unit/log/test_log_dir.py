"""The files a data directory's partitions share (LogDir): one recovery-point checkpoint in
Kafka's format, one clean-shutdown marker and one log-start-offset checkpoint; what opening
trusts of them, and samsa 0.1.0's per-partition files read and moved into them."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from test_loader import SMALL, crash, fill

from samsa.log.loader import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    read_offsets_checkpoint,
    write_offsets_checkpoint,
)
from samsa.log.log import LOG_START_OFFSET_FILE, Log, LogConfig, LogDir, OffsetOutOfRangeError

NOW = 1_700_000_000_000


def reopen(data: Path, *names: str, config: LogConfig = SMALL) -> tuple[LogDir, dict[str, Log]]:
    """A broker's start-up: take the marker, open the partitions, rewrite the checkpoint."""
    log_dir = LogDir(data)
    log_dir.begin_load()
    logs = {name: log_dir.open_log(data / name, config, NOW) for name in names}
    log_dir.end_load()
    return log_dir, logs


def filled(data: Path, names: tuple[str, ...], batches: int) -> tuple[LogDir, dict[str, Log]]:
    """A new data directory whose partitions hold ``batches`` batches of 10 records each."""
    data.mkdir()
    log_dir, logs = reopen(data, *names)
    for lg in logs.values():
        fill(lg, batches)
    return log_dir, logs


def close_all(log_dir: LogDir, logs: dict[str, Log]) -> None:
    for lg in logs.values():
        lg.close(NOW)
    log_dir.close(list(logs.values()))


def test_checkpoint_round_trip_in_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / RECOVERY_POINT_FILE
    offsets = {"a-b.c_d-12": 5, "t-0": 0, "__consumer_offsets-49": 123456789012}
    write_offsets_checkpoint(path, offsets)
    assert path.read_text() == "0\n3\na-b.c_d 12 5\nt 0 0\n__consumer_offsets 49 123456789012\n"
    assert read_offsets_checkpoint(path) == offsets
    assert read_offsets_checkpoint(tmp_path / "missing") == {}


@pytest.mark.parametrize(
    "text",
    ["0\n2\nt 0 5\n", "1\n1\nt 0 5\n", "0\n1\nt 0\n", "0\n1\nt 0 -3\n", "\xff\xfe", ""],
    ids=["short", "version", "no-offset", "negative", "binary", "empty"],
)
def test_an_unreadable_checkpoint_is_ignored_with_a_warning(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / RECOVERY_POINT_FILE
    path.write_bytes(text.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="samsa.log"):
        assert read_offsets_checkpoint(path) == {}
    assert "ignoring unreadable" in caplog.text


def test_a_torn_tmp_file_is_ignored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0",), 12)  # segments at 0, 50, 100
    logs["t-0"].flush()  # the recovery point enters segment 100: checkpointed
    # The next write was cut short before its rename: only the .tmp is damaged.
    (data / (RECOVERY_POINT_FILE + ".tmp")).write_text("0\n1\nt 0 9")
    crash(logs["t-0"])
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE) == {"t-0": 120}
    log_dir, logs = reopen(data, "t-0")
    assert not logs["t-0"].load_report.clean_shutdown
    assert logs["t-0"].load_report.recovered_segments == 1  # from 120's segment only
    close_all(log_dir, logs)


def test_a_partition_missing_from_the_checkpoint_is_scanned_from_its_first_segment(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0", "t-1"), 12)
    for lg in logs.values():
        lg.flush()
        crash(lg)
    write_offsets_checkpoint(data / RECOVERY_POINT_FILE, {"t-1": 120})  # t-0 left out
    log_dir, logs = reopen(data, "t-0", "t-1")
    assert logs["t-0"].load_report.recovered_segments == 3
    assert logs["t-1"].load_report.recovered_segments == 1
    assert [lg.log_end_offset for lg in logs.values()] == [120, 120]
    # Start-up rewrote the checkpoint with both (t-0's scanned segments are not yet synced).
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE) == {"t-0": 0, "t-1": 120}
    close_all(log_dir, logs)


def test_clean_stop_writes_two_files_then_opens_without_a_scan(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0", "t-1", "u-0"), 12)
    close_all(log_dir, logs)
    assert sorted(p.name for p in data.glob("*/" + RECOVERY_POINT_FILE)) == []
    assert sorted(p.name for p in data.glob("*/" + CLEAN_SHUTDOWN_FILE)) == []
    assert read_offsets_checkpoint(data / CLEAN_SHUTDOWN_FILE) == {
        "t-0": 120,
        "t-1": 120,
        "u-0": 120,
    }
    log_dir, logs = reopen(data, "t-0", "t-1", "u-0")
    assert not (data / CLEAN_SHUTDOWN_FILE).exists()  # taken: a crash now is not clean
    for lg in logs.values():
        assert lg.load_report.clean_shutdown and lg.load_report.recovered_segments == 0
        assert lg.recovery_point == 120
        crash(lg)
    log_dir, logs = reopen(data, "t-0", "t-1", "u-0")
    for lg in logs.values():  # recovered from the checkpointed recovery point
        assert not lg.load_report.clean_shutdown
        assert lg.load_report.recovered_segments == 1
    close_all(log_dir, logs)


def test_the_marker_vouches_only_for_the_partitions_it_names(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0", "t-1", "t-2"), 7)
    for lg in logs.values():
        lg.close(NOW)
    log_dir.close([logs["t-0"], logs["t-2"]])  # t-1's close failed
    os.rename(data / "t-2", data / "moved")  # t-2 deleted by hand
    log_dir, logs = reopen(data, "t-0", "t-1")
    assert logs["t-0"].load_report.clean_shutdown
    assert not logs["t-1"].load_report.clean_shutdown
    assert logs["t-1"].load_report.recovered_segments == 1
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE).keys() == {"t-0", "t-1"}
    # t-1 deleted: the checkpoint on disk still names it, at 70. A new t-1 (here with old
    # t-2's files: two segments, never flushed) must not inherit that, even after a crash.
    logs["t-1"].delete()
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE)["t-1"] == 70
    os.rename(data / "moved", data / "t-1")
    t1 = log_dir.open_log(data / "t-1", SMALL, NOW)
    assert not t1.load_report.clean_shutdown
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE)["t-1"] == 0
    crash(t1)
    crash(logs["t-0"])
    log_dir, logs = reopen(data, "t-0", "t-1")
    assert logs["t-1"].load_report.recovered_segments == 2  # from its first segment
    close_all(log_dir, logs)


@pytest.mark.parametrize("restarted", [False, True], ids=["new-and-empty", "restarted"])
def test_an_idle_clean_stop_fsyncs_the_same_for_any_number_of_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restarted: bool
) -> None:
    def fsyncs_of_a_clean_stop(count: int) -> int:
        names = tuple(f"t-{i}" for i in range(count))
        data = tmp_path / f"d{count}"
        log_dir, logs = filled(data, names, 2 if restarted else 0)
        if restarted:
            close_all(log_dir, logs)
            log_dir, logs = reopen(data, *names)  # nothing appended since
        calls: list[int] = []
        real_fsync, real_fdatasync = os.fsync, os.fdatasync
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
        monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real_fdatasync(fd))[1])
        close_all(log_dir, logs)
        monkeypatch.undo()
        return len(calls)

    # The checkpoint and the marker: each file and the directory.
    assert fsyncs_of_a_clean_stop(2) == fsyncs_of_a_clean_stop(20) == 4


def test_samsa_0_1_0_partition_files_are_read_and_moved(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # samsa 0.1.0 kept each partition's recovery point and marker in its directory, as a
    # log opened on its own still does.
    old = Log.open(data / "t-0", SMALL, NOW)
    fill(old, 12)
    old.flush()  # segments at 0, 50, 100; recovery point 120, in t-0's own file
    crash(old)
    old = Log.open(data / "t-1", SMALL, NOW)
    fill(old, 12)
    old.close(NOW)  # a clean close of 0.1.0: its own marker
    assert (data / "t-0" / RECOVERY_POINT_FILE).read_text() == "0\n120\n"
    assert (data / "t-1" / CLEAN_SHUTDOWN_FILE).exists()
    log_dir, logs = reopen(data, "t-0", "t-1")
    assert logs["t-0"].load_report.recovered_segments == 1  # its recovery point was used
    assert not logs["t-0"].load_report.clean_shutdown
    assert logs["t-1"].load_report.clean_shutdown
    assert logs["t-1"].load_report.recovered_segments == 0
    assert read_offsets_checkpoint(data / RECOVERY_POINT_FILE) == {"t-0": 120, "t-1": 120}
    assert list(data.glob("*/" + RECOVERY_POINT_FILE)) == []
    assert list(data.glob("*/" + CLEAN_SHUTDOWN_FILE)) == []
    for lg in logs.values():
        crash(lg)
    log_dir, logs = reopen(data, "t-0", "t-1")  # now from the directory's checkpoint
    assert [lg.load_report.recovered_segments for lg in logs.values()] == [1, 1]
    close_all(log_dir, logs)


def test_a_name_that_is_not_topic_partition_is_refused(tmp_path: Path) -> None:
    log_dir = LogDir(tmp_path)
    with pytest.raises(ValueError, match="not a <topic>-<partition> directory"):
        log_dir.open_log(tmp_path / "notapartition", SMALL, NOW)
    with pytest.raises(ValueError, match="not a <topic>-<partition> directory"):
        log_dir.open_log(tmp_path / "sub" / "t-0", SMALL, NOW)


def _counting_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real_fdatasync(fd))[1])
    return calls


def test_delete_records_of_many_partitions_writes_one_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    names = tuple(f"t-{i}" for i in range(20))
    log_dir, logs = filled(data, names, 12)  # segments at 0, 50, 100 in each
    calls = _counting_fsyncs(monkeypatch)
    with log_dir.grouped_log_starts():  # a DeleteRecords request's partitions
        for i, lg in enumerate(logs.values()):
            assert lg.delete_records_before(55 + i) == 55 + i
    monkeypatch.undo()
    assert len(calls) == 2  # the checkpoint and the directory: not 2 per partition
    assert read_offsets_checkpoint(data / LOG_START_OFFSET_FILE) == {
        name: 55 + i for i, name in enumerate(names)
    }
    assert list(data.glob("*/" + LOG_START_OFFSET_FILE)) == []
    # Then the segments wholly below each start went: [0, 50).
    assert all(lg.segments[0].base_offset == 50 for lg in logs.values())
    for lg in logs.values():
        crash(lg)
    log_dir, logs = reopen(data, *names)
    for i, lg in enumerate(logs.values()):
        assert lg.log_start_offset == 55 + i  # never back after a crash
        with pytest.raises(OffsetOutOfRangeError):
            lg.read(54, 1 << 20)
    close_all(log_dir, logs)


def test_a_start_at_a_segment_base_survives_its_segments_coming_back(tmp_path: Path) -> None:
    # The segments below a start are deleted without a directory fsync: should a crash bring
    # them back, the checkpoint still names the start (even at the first base left), and
    # retention deletes them.
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0", "u-0"), 12)
    saved = {p.name: p.read_bytes() for p in (data / "t-0").glob("00000000000000000000.*")}
    assert logs["t-0"].delete_records_before(50) == 50
    assert logs["u-0"].delete_records_before(7) == 7  # a later checkpoint still names t-0
    assert read_offsets_checkpoint(data / LOG_START_OFFSET_FILE) == {"t-0": 50, "u-0": 7}
    for lg in logs.values():
        crash(lg)
    for name, content in saved.items():  # the unlink was lost
        (data / "t-0" / name).write_bytes(content)
    log_dir, logs = reopen(data, "t-0", "u-0", config=LogConfig(segment_bytes=6000))
    assert logs["t-0"].log_start_offset == 50
    assert logs["t-0"].apply_retention(NOW) == 1
    assert [s.base_offset for s in logs["t-0"].segments] == [50, 100]
    close_all(log_dir, logs)


def test_samsa_0_1_0_log_start_files_are_read_and_moved(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("t-0", "t-1"):
        old = Log.open(data / name, SMALL, NOW)  # 0.1.0: each partition's own file
        fill(old, 12)
        old.delete_records_before(60)
        old.close(NOW)
    # The directory's checkpoint is behind one of them, ahead of the other: the higher wins.
    write_offsets_checkpoint(data / LOG_START_OFFSET_FILE, {"t-0": 40, "t-1": 70})
    log_dir, logs = reopen(data, "t-0", "t-1")
    assert [lg.log_start_offset for lg in logs.values()] == [60, 70]
    assert read_offsets_checkpoint(data / LOG_START_OFFSET_FILE) == {"t-0": 60, "t-1": 70}
    assert list(data.glob("*/" + LOG_START_OFFSET_FILE)) == []
    close_all(log_dir, logs)


def test_a_new_partition_does_not_inherit_a_deleted_ones_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0", "u-0"), 12)
    logs["t-0"].delete_records_before(60)
    logs["t-0"].delete()  # the topic is deleted; the checkpoint still names it
    again = log_dir.open_log(data / "t-0", SMALL, NOW)  # and made again
    fill(again, 12)
    crash(again)
    crash(logs["u-0"])
    log_dir, logs = reopen(data, "t-0", "u-0")
    assert logs["t-0"].log_start_offset == 0
    close_all(log_dir, logs)


def test_a_failed_checkpoint_is_an_error_and_written_again_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    log_dir, logs = filled(data, ("t-0",), 12)

    def refuse(*_: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr("samsa.log.log.write_offsets_checkpoint", refuse)
        with pytest.raises(OSError):
            logs["t-0"].delete_records_before(60)
    assert [s.base_offset for s in logs["t-0"].segments] == [0, 50, 100]  # nothing deleted
    close_all(log_dir, logs)
    assert read_offsets_checkpoint(data / LOG_START_OFFSET_FILE) == {"t-0": 60}
