"""The layering of docs/architecture.md, enforced: every ``samsa`` import in ``src/samsa`` (at
module level or inside a function, ``TYPE_CHECKING`` blocks included) goes from a package to
one it may import, and ``protocol/`` stays sans-IO."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "samsa"

# Which top-level parts of samsa each part may import (besides itself). The table of
# docs/architecture.md; a new edge is a design decision: change both.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "log": frozenset({"protocol"}),
    "coordinator": frozenset({"protocol"}),
    "broker": frozenset({"protocol", "log", "coordinator"}),
    "client": frozenset({"protocol"}),
    "testing": frozenset({"protocol", "client"}),
    "verify": frozenset({"protocol", "client", "testing"}),
    "spark": frozenset({"protocol", "client"}),
    "demo": frozenset({"protocol", "client", "spark", "testing"}),
    "cli": frozenset({"protocol", "client", "broker", "testing", "verify", "demo"}),
    "__main__": frozenset({"cli"}),
    "__init__": frozenset(),
}

# protocol/ parses and builds bytes; it never does I/O or waits.
SANS_IO_FORBIDDEN = frozenset({"asyncio", "socket", "selectors", "ssl", "threading", "os"})


def _part(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(("samsa", *path.relative_to(root).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def layer_violations(root: Path = SRC) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        part = _part(path, root)
        allowed = MAY_IMPORT.get(part)
        if allowed is None:
            out.append(f"{path.relative_to(root)}: part {part!r} is not in the layer table")
            continue
        for line, module in _imports(path, root):
            names = module.split(".")
            if names[0] == "samsa" and len(names) > 1 and names[1] not in (part, *allowed):
                out.append(f"{path.relative_to(root)}:{line}: {part} imports {module}")
            if part == "protocol" and names[0] in SANS_IO_FORBIDDEN:
                out.append(f"{path.relative_to(root)}:{line}: protocol is sans-IO: {module}")
    return out


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert layer_violations() == []


def test_the_table_has_no_cycle() -> None:
    seen: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(part: str) -> None:
        assert seen.get(part) != 1, f"cycle through {part}"
        if seen.get(part) == 2:
            return
        seen[part] = 1
        for dep in MAY_IMPORT[part]:
            visit(dep)
        seen[part] = 2

    for part in MAY_IMPORT:
        visit(part)


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        (
            "coordinator/x.py",
            "from samsa.broker.topics import TopicManager\n",
            "coordinator imports",
        ),
        ("log/x.py", "def f():\n    import samsa.coordinator.runtime\n", "log imports"),
        ("protocol/x.py", "from ..log import log\n", "protocol imports samsa.log"),
        ("protocol/x.py", "import asyncio\n", "sans-IO"),
        ("client/x.py", "from samsa.broker import broker\n", "client imports"),
    ],
)
def test_the_check_catches_an_upward_import(
    tmp_path: Path, where: str, source: str, expected: str
) -> None:
    target = tmp_path / where
    target.parent.mkdir(parents=True)
    target.write_text(source)
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "ok.py").write_text("from samsa.coordinator.ports import Appended\n")
    (problem,) = layer_violations(tmp_path)
    assert expected in problem and where in problem
