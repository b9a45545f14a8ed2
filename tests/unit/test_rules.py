"""docs/semantics.md is the project's statement of its rules, and the code cites it: every
"rule N" cited in ``src/`` and ``tests/`` names a rule that exists, and every rule's number is
cited in the docstring of a test module of its group (the modules listed here). What is checked
is the citation only: that the module's tests exercise the rule it names is left to review
(none of these modules cites its rules test by test)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEMANTICS = ROOT / "docs" / "semantics.md"

# Each rule group of docs/semantics.md (its heading) -> the test modules whose docstrings name
# its rules.
GROUP_MODULES: dict[str, tuple[str, ...]] = {
    "Produce": ("tests/unit/broker/test_produce_rules.py",),
    "InitProducerId": (
        "tests/unit/broker/test_config_and_ids.py",
        "tests/unit/coordinator/test_txn_coordinator.py",
    ),
    "Expiry, snapshots and recovery": (
        "tests/unit/log/test_producer_state.py",
        "tests/unit/log/test_snapshot.py",
    ),
    "Transactions": (
        "tests/unit/coordinator/test_txn_coordinator.py",
        "tests/unit/coordinator/test_txn_offsets_order.py",
        "tests/unit/log/test_txn_log.py",
    ),
    "What clients do": (
        "tests/chaos/test_client_faults.py",
        "tests/unit/client/test_transactions_states.py",
    ),
    "Consumer groups": (
        "tests/unit/coordinator/test_group_coordinator.py",
        "tests/unit/coordinator/test_txn_offsets_order.py",
    ),
    "Consumer groups of the consumer protocol": ("tests/unit/coordinator/test_consumer_group.py",),
    "Transactions v2 and two-phase commit": (
        "tests/unit/coordinator/test_txn_v2_2pc.py",
        "tests/unit/broker/test_txn_v2_2pc_protocol.py",
    ),
    "Coordinators and replay": (
        "tests/unit/coordinator/test_lost_state.py",
        "tests/unit/coordinator/test_txn_runtime.py",
    ),
    "Topic configs and the log start offset": (
        "tests/unit/broker/test_topic_config_table.py",
        "tests/unit/log/test_log_topic_configs.py",
    ),
    "Authorization": ("tests/unit/broker/test_authorizer.py",),
    "Online migration between the group protocols": (
        "tests/unit/coordinator/test_group_migration.py",
    ),
    "Topic configs applied on append": (
        "tests/unit/log/test_log_validator.py",
        "tests/unit/broker/test_produce_topic_configs.py",
        "tests/unit/broker/test_topic_config_table.py",
    ),
    "Dynamic broker configs": ("tests/unit/broker/test_dynamic_broker_config.py",),
    "Finalized features": ("tests/unit/broker/test_features.py",),
}

_RULE = re.compile(r"^(\d+)\. \*\*", re.M)
_HEADING = re.compile(r"^## (.+)$", re.M)
# "rule 6", "rules 2-6", "rules 6 and 13", "rules 2-6, 12 and 16-17"
_CITED = re.compile(r"\brules?\s+(\d+(?:\s*-\s*\d+)?(?:(?:,\s*|\s+and\s+)\d+(?:\s*-\s*\d+)?)*)")


def rule_groups(text: str) -> dict[str, list[int]]:
    """Heading (up to its first colon or parenthesis) -> the rule numbers under it."""
    groups: dict[str, list[int]] = {}
    current = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = re.split(r"[:(]", heading.group(1))[0].strip()
            continue
        rule = _RULE.match(line)
        if rule and current is not None:
            groups.setdefault(current, []).append(int(rule.group(1)))
    return groups


def cited(text: str) -> set[int]:
    out: set[int] = set()
    for m in _CITED.finditer(text):
        for part in re.split(r",\s*|\s+and\s+", m.group(1)):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_rules_are_numbered_in_order_and_grouped() -> None:
    groups = rule_groups(SEMANTICS.read_text())
    numbers = [n for rules in groups.values() for n in rules]
    assert numbers == list(range(1, len(numbers) + 1))
    assert set(groups) == set(GROUP_MODULES)


def test_every_citation_names_an_existing_rule() -> None:
    known = {n for rules in rule_groups(SEMANTICS.read_text()).values() for n in rules}
    wrong = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        for n in cited(path.read_text()) - known:
            wrong.append(f"{path.relative_to(ROOT)}: rule {n}")
    assert wrong == []


def test_every_rule_is_named_by_a_test_module_of_its_group() -> None:
    groups = rule_groups(SEMANTICS.read_text())
    missing = []
    for group, rules in groups.items():
        named: set[int] = set()
        for module in GROUP_MODULES[group]:
            doc = ast.get_docstring(ast.parse((ROOT / module).read_text())) or ""
            assert "docs/semantics.md" in doc, module
            named |= cited(doc)
        missing += [f"{group}: rule {n}" for n in rules if n not in named]
    assert missing == []


def test_citations_are_read_as_written() -> None:
    assert cited("rule 6; rules 2-6, 12 and 16-17; rules 6 and 13") == {
        2,
        3,
        4,
        5,
        6,
        12,
        13,
        16,
        17,
    }
    assert rule_groups("## A: x\n1. **a.**\n## B (y)\n2. **b.**\n") == {"A": [1], "B": [2]}
