"""Lock names and who may take them (guardedcron.spec.locks), and reading a live
CronJob's locks back (builders.locks_in_cronjob), which the operator trusts to decide
whether a CronJob must go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from guardedcron.builders import build_cronjob, locks_in_cronjob
from guardedcron.spec import parse_guarded_cronjob
from guardedcron.spec.locks import (
    SharedLock,
    may_use,
    namespace_lock,
    shared_lock,
    shared_lock_refusal,
)
from tests.support.gcj import DEFAULT_SETTINGS, base_gcj, put

ALLOWED = (SharedLock("ledger-close", frozenset({"finance", "billing"})),
           SharedLock("month-end", frozenset({"finance"})))


def test_lock_names() -> None:
    assert namespace_lock("billing", "invoices") == "billing/invoices"
    assert shared_lock("ledger-close") == "shared:ledger-close"


def test_a_namespace_may_use_its_own_locks_and_the_shared_locks_granted_to_it() -> None:
    assert may_use("billing", "billing/invoices", ())
    assert may_use("billing", "shared:ledger-close", ALLOWED)
    assert may_use("finance", "shared:month-end", ALLOWED)


def test_a_namespace_may_not_use_anything_else() -> None:
    assert not may_use("billing", "shared:month-end", ALLOWED)  # listed, not for billing
    assert not may_use("billing", "shared:ledger-close", ())  # no allow-list
    assert not may_use("billing", "shared:ledger", ALLOWED)  # a prefix of a listed name
    assert not may_use("fin", "finance/x", ALLOWED)  # a namespace that is a prefix of another
    assert not may_use("billing", "billing", ())  # no separator: a pre-issue-11 name
    assert not may_use("billing", "payments/billing/x", ())
    assert not may_use("billing", "ledger-close", ALLOWED)


def test_the_refusal_names_the_setting_and_what_the_list_grants() -> None:
    setting = "the chart value sharedLocks"
    assert shared_lock_refusal("finance", "month-end", ALLOWED, setting=setting) is None
    granted_elsewhere = shared_lock_refusal("billing", "month-end", ALLOWED, setting=setting)
    assert granted_elsewhere == (
        "namespace billing may not use shared lock 'month-end': the cluster admin's "
        "allow-list, the chart value sharedLocks, grants 'month-end' to namespaces finance "
        "only; no CronJob runs until it allows this namespace or spec.lease.sharedLock is "
        "removed")
    unlisted = shared_lock_refusal("billing", "payroll", ALLOWED, setting=setting)
    assert unlisted is not None and "lists no shared lock 'payroll'" in unlisted


@settings(max_examples=200, deadline=None)
@given(name=st.text(st.characters(blacklist_characters="/:", blacklist_categories=("Cc", "Cs")),
                    min_size=1, max_size=40))
def test_the_lock_read_back_from_a_built_cronjob_is_the_specs(name: str) -> None:
    # `$` is escaped against Kubernetes' $(VAR) expansion in args; reading back undoes it.
    parsed = parse_guarded_cronjob(put(put(base_gcj(), "spec.lease.name", name),
                                       "spec.lease.heartbeat", True))
    cronjob = build_cronjob(parsed, DEFAULT_SETTINGS)
    assert locks_in_cronjob(cronjob) == {f"billing/{name}"}


def test_a_shared_lock_is_read_back_from_guard_keeper_and_annotation() -> None:
    parsed = parse_guarded_cronjob(put(put(base_gcj(), "spec.lease.sharedLock", "ledger-close"),
                                       "spec.lease.heartbeat", True))
    cronjob = build_cronjob(parsed, DEFAULT_SETTINGS)
    assert locks_in_cronjob(cronjob) == {"shared:ledger-close"}
    # Each place counts on its own: a CronJob edited in one place still shows that lock.
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    keeper = pod["initContainers"][1]
    keeper["args"][keeper["args"].index("--lock") + 1] = "payments/x"
    assert locks_in_cronjob(cronjob) == {"shared:ledger-close", "payments/x"}
    assert locks_in_cronjob({}) == set()
