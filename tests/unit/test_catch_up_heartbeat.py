"""catchUp.policy All with maxRuns above 1 and no lease.heartbeat: accepted (objects like
it were accepted before), but warned about (status/catchup.py heartbeat_warning;
docs/design.md, "One slot per lease")."""

from __future__ import annotations

from typing import Any

import pytest

from guardedcron.spec import parse_guarded_cronjob
from guardedcron.status.catchup import heartbeat_warning
from guardedcron.status.transitions import WARNINGS, EventReason
from tests.support.gcj import base_gcj, put


def warning_for(catch_up: dict[str, Any] | None, heartbeat: bool) -> str | None:
    body = put(base_gcj(), "spec.lease.heartbeat", heartbeat)
    if catch_up is not None:
        body = put(body, "spec.catchUp", catch_up)
    return heartbeat_warning(parse_guarded_cronjob(body))


def test_several_make_up_runs_without_the_keeper_are_warned_about() -> None:
    message = warning_for({"policy": "All", "maxRuns": 3}, heartbeat=False)
    assert message is not None
    assert message.startswith("catchUp.policy All with maxRuns 3 needs lease.heartbeat")
    assert "durationSeconds (3900 s)" in message
    assert EventReason.CATCH_UP_WITHOUT_HEARTBEAT in WARNINGS


@pytest.mark.parametrize(("catch_up", "heartbeat"), [
    ({"policy": "All", "maxRuns": 3}, True),
    ({"policy": "All", "maxRuns": 1}, False),
    ({"policy": "Latest"}, False),
    (None, False),
])
def test_one_make_up_run_or_the_keeper_needs_no_warning(catch_up: dict[str, Any] | None,
                                                        heartbeat: bool) -> None:
    assert warning_for(catch_up, heartbeat) is None
