"""The tests' own layout: pytest imports test modules by basename (rootdir-relative
``prepend`` import mode, no ``__init__.py`` packages), so two test files of one name anywhere
under tests/ make the whole suite fail to collect. Keep every basename unique."""

from __future__ import annotations

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
