"""The tests' own layout: pytest imports test modules by basename (rootdir-relative
``prepend`` import mode, no ``__init__.py`` packages), so two test files of one name anywhere
under tests/ make the whole suite fail to collect. Keep every basename unique. Tests that start
broker processes carry the ``brokers`` marker (set by tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename: {clashes}"
    assert len(where) > 100  # the walk found the suite


def test_tests_that_start_brokers_are_marked() -> None:
    # test_features.py has each kind: tests on a module fixture's broker, one starting its own,
    # and in-process ones.
    features = TESTS / "unit" / "broker" / "test_features.py"
    collect = ["pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-m", "not brokers"]
    out = subprocess.run(
        [sys.executable, "-m", *collect, str(features)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TESTS.parent,
    )
    names = {line.split("::")[1].split("[")[0] for line in out.stdout.splitlines() if "::" in line}
    assert names == {"test_a_damaged_file_stops_the_start", "test_a_refused_update_writes_nothing"}
