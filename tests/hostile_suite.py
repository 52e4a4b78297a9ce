"""The hostile-input suite: ``@pytest.mark.hostile("FAMILY")`` on a test (or one parametrize case) makes it a
hostile case of FAMILY; ``make hostile`` runs every such case of both lanes and this plugin prints, per family,
how many were tried and how many were clean (a case is clean when it passes; a skipped case is not tried and
is counted apart). The families are named here, once: a marker naming another is a collection error, so a
typo cannot start a family of its own. The hooks are imported by ``tests/conftest.py``.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

# Issue 50's nine families, then those of earlier rounds that none of the nine fits.
FAMILIES = (
    "plan groups",
    "memory caps",
    "rank speeds",
    "epoch-time reports",
    "validate scratch",
    "sweep fidelity",
    "publishing",
    "python api",
    "files and cli",
    "tables",
    "cache",
    "recorder",
    "replan",
    "integrity",
)
_KEY = "hostile family"
_outcomes: dict[str, dict[str, str]] = defaultdict(dict)  # family -> nodeid -> passed/failed/skipped


def _family(item: pytest.Item) -> str | None:
    """The family of ``item``'s closest ``hostile`` marker (a parametrize case's mark wins over its test's)."""
    own = [m for m in item.own_markers if m.name == "hostile"]  # the test's marks, then its case's
    mark = own[-1] if own else item.get_closest_marker("hostile")  # else its class's or module's
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs or mark.args[0] not in FAMILIES:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.hostile takes one family, one of {', '.join(FAMILIES)} "
            f"(tests/hostile_suite.py); got {mark.args!r}{mark.kwargs or ''}"
        )
    return str(mark.args[0])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Records each hostile case's family on the item; the reports carry it to the controller under xdist."""
    for item in items:
        family = _family(item)
        if family is not None:
            item.user_properties.append((_KEY, family))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A case is clean when setup, call and teardown all pass; one failed phase makes it unclean."""
    family = dict(report.user_properties).get(_KEY)
    if family is None:
        return
    seen = _outcomes[family]
    if report.failed:
        seen[report.nodeid] = "failed"
    elif report.skipped and seen.get(report.nodeid) != "failed":
        seen[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed:
        seen.setdefault(report.nodeid, "passed")


def pytest_terminal_summary(terminalreporter) -> None:
    """Prints the per-family table of a session that ran hostile cases (none printed otherwise)."""
    if not _outcomes:
        return
    tr = terminalreporter
    tr.section("hostile suite: tried / clean per family")
    tr.write_line(f"{'family':<20} {'tried':>5} / clean")
    total: Counter[str] = Counter()
    for family in FAMILIES:
        counts = Counter(_outcomes.get(family, {}).values())
        if not counts:
            continue
        total.update(counts)
        tried = counts["passed"] + counts["failed"]
        skipped = f" ({counts['skipped']} skipped)" if counts["skipped"] else ""
        tr.write_line(f"{family:<20} {tried:>5} / {counts['passed']:<5}{skipped}")
    tried = total["passed"] + total["failed"]
    skipped = f" ({total['skipped']} skipped)" if total["skipped"] else ""
    tr.write_line(f"{'all':<20} {tried:>5} / {total['passed']:<5}{skipped}")
