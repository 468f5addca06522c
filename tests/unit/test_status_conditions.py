"""The conditions helper: transitions, observedGeneration, order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from guardedcron.status import get_condition, is_true, set_condition

T1 = datetime(2025, 1, 10, 8, 0, 0, 123456, tzinfo=UTC)
T2 = T1 + timedelta(hours=1)


def test_a_new_condition_gets_every_field() -> None:
    conditions = set_condition(None, type="Ready", status="True", reason="CronJobReady",
                               message="in place", observed_generation=3, now=T1)
    assert conditions == [{"type": "Ready", "status": "True", "reason": "CronJobReady", "message": "in place",
                           "observedGeneration": 3, "lastTransitionTime": "2025-01-10T08:00:00Z"}]


def test_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition([], type="Ready", status="False", reason="CronJobMissing", message="a",
                          observed_generation=1, now=T1)
    reworded = set_condition(first, type="Ready", status="False", reason="CronJobRejected", message="b",
                             observed_generation=2, now=T2)
    assert reworded[0]["lastTransitionTime"] == "2025-01-10T08:00:00Z"
    assert (reworded[0]["reason"], reworded[0]["message"], reworded[0]["observedGeneration"]) == (
        "CronJobRejected", "b", 2)
    flipped = set_condition(reworded, type="Ready", status="True", reason="CronJobReady", message="c",
                            observed_generation=2, now=T2)
    assert flipped[0]["lastTransitionTime"] == "2025-01-10T09:00:00Z"


def test_the_input_is_not_changed() -> None:
    original = [{"type": "Ready", "status": "False", "reason": "X", "message": "",
                 "observedGeneration": 1, "lastTransitionTime": "2025-01-10T08:00:00Z"}]
    snapshot = [dict(c) for c in original]
    set_condition(original, type="Ready", status="True", reason="Y", message="", observed_generation=2,
                  now=T2)
    assert original == snapshot


def test_order_is_fixed_whatever_the_order_of_setting() -> None:
    a = None
    for kind in ("Overlap", "Zeta", "Ready", "Degraded", "Invalid", "Alpha", "MissedRun", "Stalled"):
        a = set_condition(a, type=kind, status="False", reason="R", message="", observed_generation=1, now=T1)
    assert [c["type"] for c in a or []] == [
        "Ready", "Invalid", "Stalled", "MissedRun", "Overlap", "Degraded", "Alpha", "Zeta"]


def test_long_messages_are_bounded() -> None:
    conditions = set_condition(None, type="Invalid", status="True", reason="SpecInvalid", message="x" * 5000,
                               observed_generation=1, now=T1)
    assert len(conditions[0]["message"]) == 1024 and conditions[0]["message"].endswith("…")


@pytest.mark.parametrize(("status", "reason"), [("true", "R"), ("True", "")])
def test_bad_arguments_are_refused(status: str, reason: str) -> None:
    with pytest.raises(ValueError):
        set_condition(None, type="Ready", status=status, reason=reason,  # type: ignore[arg-type]
                      message="", observed_generation=1, now=T1)


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        set_condition(None, type="Ready", status="True", reason="R", message="", observed_generation=1,
                      now=datetime(2025, 1, 1))


def test_lookup() -> None:
    conditions = set_condition(None, type="Overlap", status="True", reason="RunsOverlapped", message="m",
                               observed_generation=1, now=T1)
    assert get_condition(conditions, "Overlap") == conditions[0]
    assert get_condition(conditions, "Ready") is None
    assert is_true(conditions, "Overlap") and not is_true(conditions, "Ready") and not is_true(None, "Ready")
