"""The order within one pytest session (wired in tests/conftest.py). `make test` runs
several sessions (guardedcron_devenv.suite): the quiet checks alone, three lanes side by
side, the node tier alone; this order holds inside each, and in a plain `pytest` run.

A check that times the guard itself (the seeds' 5-second burst) must measure the guard, not
the suites beside it: it runs first, before any session-wide server or control plane has
started. The e2e suite runs late, because its control planes are session-scoped and keep
running beside every test after the first e2e test, and the node tier last: one real node
per machine at a time, its machine-wide state (iptables, cgroups) checked clean first.
Otherwise the collection order.
"""

from __future__ import annotations

import pytest

QUIET_MACHINE = "quiet_machine"
QUIET_MACHINE_MARKER = (
    f"{QUIET_MACHINE}: times the guard itself (the seeds' 5-second check), so it runs first,"
    " before any session-wide server or control plane has started"
)


def rank(item: pytest.Item) -> int:
    if item.get_closest_marker(QUIET_MACHINE):
        return 0
    if item.get_closest_marker("node"):
        return 3
    return 2 if item.get_closest_marker("e2e") else 1


def quiet_checks_first_e2e_last(items: list[pytest.Item]) -> None:
    items.sort(key=rank)  # stable: the collection order within each rank
