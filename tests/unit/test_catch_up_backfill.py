"""Catch-up and backfill decisions (status/catchup.py, status/backfill.py), with an
injected clock: which past slot the operator starts next, and how a backfill advances.

Schedules are in UTC here ("*/10 * * * *": slots on the tens of minutes); spec
startingDeadlineSeconds 600 and missedRunToleranceSeconds 60 make a slot due (missed if
it has no run) 11 minutes after it.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from guardedcron import contract
from guardedcron.builders.manual import build_slot_job
from guardedcron.cli import guard_commands
from guardedcron.cli.main import main
from guardedcron.spec import ParsedSpec, SpecError, parse_guarded_cronjob
from guardedcron.spec.parse import MAX_CATCH_UP_WINDOW_SECONDS
from guardedcron.status import Outcome, RunRecord, classify_run
from guardedcron.status.backfill import (
    COMPLETED,
    INVALID,
    RUNNING,
    STOPPED,
    BackfillRequestError,
    advance_backfill,
    oldest_backfill_slot,
    parse_backfill,
    started,
)
from guardedcron.status.catchup import plan_catch_up
from guardedcron.status.runs import SLOT_CLAIMED_WORDS, is_manual, scheduled_slot
from guardedcron.status.times import epoch_minute, format_time, parse_time
from tests.support import REPO
from tests.support.gcj import DEFAULT_SETTINGS, base_gcj, put

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
CREATED = datetime(2026, 11, 1, tzinfo=UTC)


def at(hhmm: str) -> datetime:
    hour, minute = hhmm.split(":")
    return NOW.replace(hour=int(hour), minute=int(minute), second=0)


def parsed(**spec: Any) -> ParsedSpec:
    body = put(base_gcj(), "spec.schedule", "*/10 * * * *")
    body = put(body, "spec.timeZone", "UTC")
    for key, value in spec.items():
        body = put(body, f"spec.{key}", value)
    return parse_guarded_cronjob(body)


def ran(slot: datetime, outcome: Outcome = Outcome.SUCCEEDED, *, final: bool = True,
        kind: str | None = None, attempt: int = 1, reason: str = "x",
        finished: datetime | None = None) -> RunRecord:
    """A run of `slot`: the controller's Job, or (`kind`) the operator's attempt at it."""
    minute = epoch_minute(slot)
    job = (f"nightly-invoices-{minute}" if kind is None
           else contract.attempt_job_name("nightly-invoices", minute, kind, attempt))
    return RunRecord(job=job, outcome=outcome, reason=reason, slot=minute,
                     scheduled_at=slot, started_at=slot,
                     finished_at=(finished or slot + timedelta(minutes=1)) if final else None)


LEASE_HELD = "lease held by west/billing/nightly-invoices-29408890-b1-x (fence 7)"
CLAIMED = "slot 29408890 already ran under west/billing/x (fence 7)"


def plan(spec: ParsedSpec, runs: list[RunRecord], *, previous: dict[str, Any] | None = None,
         busy: bool = False, suspended: bool = False, now: datetime = NOW) -> Any:
    return plan_catch_up(spec, runs=runs, created_at=CREATED, last_schedule_time=None,
                         previous=previous, busy=busy, suspended=suspended, now=now)


# --- spec ----------------------------------------------------------------------------

def test_catch_up_defaults_to_none_and_suspend_after_failures_to_never() -> None:
    spec = parse_guarded_cronjob(base_gcj()).spec
    assert (spec.catch_up.policy, spec.catch_up.window_seconds, spec.catch_up.max_runs) == ("None", 3600, 1)
    assert spec.suspend_after_failures is None


@pytest.mark.parametrize(("field", "value", "words"), [
    ("catchUp", {"policy": "Latest", "maxRuns": 2}, "above 1 needs spec.catchUp.policy All"),
    ("catchUp", {"policy": "Sometimes"}, "must be one of None, Latest, All"),
    ("catchUp", {"policy": "All", "windowSeconds": 59}, "must be at least 60"),
    ("catchUp", {"policy": "All", "windowSeconds": 604801}, "must be at most 604800"),
    ("catchUp", {"policy": "All", "maxRuns": 101}, "must be at most 100"),
    ("catchUp", "All", "must be an object"),
    ("suspendAfterFailures", 0, "must be from 1 to 1000"),
    ("suspendAfterFailures", True, "must be an integer"),
])
def test_bad_fields_are_refused_with_their_path(field: str, value: Any, words: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_guarded_cronjob(put(base_gcj(), f"spec.{field}", value))
    [(path, message)] = error.value.problems
    assert path.startswith(f"spec.{field}") and words in message, error.value.problems


# --- catch-up --------------------------------------------------------------------------

def test_policy_none_plans_nothing() -> None:
    assert plan(parsed(), []) is None


def test_latest_makes_up_the_newest_missed_slot_and_gives_up_older_ones() -> None:
    spec = parsed(catchUp={"policy": "Latest", "windowSeconds": 3600})
    # Due by now: slots up to 11:40 (11:50 is due at 12:01). 11:10 ran; 11:20-11:40 missed.
    result = plan(spec, [ran(at("11:10"))])
    assert result.start == at("11:40")
    assert result.given_up == (at("11:20"), at("11:30"))
    assert result.settled_through == at("11:30")  # the choice cannot move to 11:30 next pass


def test_all_makes_up_oldest_first_within_max_runs_one_per_pass() -> None:
    spec = parsed(catchUp={"policy": "All", "windowSeconds": 7200, "maxRuns": 3})
    # Missed since 10:10 (window floor 10:00:30): 10:10 ... 11:40, newest three kept.
    first = plan(spec, [])
    assert first.start == at("11:20")
    assert first.given_up[-1] == at("11:10") and first.settled_through == at("11:10")
    status = first.to_status(None)
    # The make-up Job for 11:20 exists (running): busy, nothing more starts.
    catch_up = contract.RUN_KIND_CATCH_UP
    running = [ran(at("11:20"), final=False, kind=catch_up)]
    second = plan(spec, running, previous=status, busy=True)
    assert second.start is None and second.settled_through == at("11:10")
    # Finished: the next oldest of the chosen ones, never an older given-up one.
    third = plan(spec, [ran(at("11:20"), kind=catch_up)], previous=status)
    assert third.start == at("11:30")
    fourth = plan(spec, [ran(at(t), kind=catch_up) for t in ("11:20", "11:30")], previous=status)
    assert fourth.start == at("11:40")
    done = plan(spec, [ran(at(t), kind=catch_up) for t in ("11:20", "11:30", "11:40")], previous=status)
    assert done.start is None and done.settled_through == at("11:40")


def test_a_slot_is_missed_only_past_its_deadline_and_inside_the_window() -> None:
    spec = parsed(catchUp={"policy": "All", "windowSeconds": 1800, "maxRuns": 10})
    # Floor 11:30:30: 11:40 is the only due slot inside it; 11:50 is not due until 12:01.
    result = plan(spec, [])
    assert (result.start, result.given_up) == (at("11:40"), ())


def test_a_slot_is_made_up_unless_a_run_of_it_started_somewhere() -> None:
    spec = parsed(catchUp={"policy": "All", "windowSeconds": 1800, "maxRuns": 10})
    guard_error = ran(at("11:40"), Outcome.GUARD_ERROR)  # the controller's Job, which still exists
    made_up = plan(spec, [guard_error])
    assert (made_up.start, made_up.attempt) == (at("11:40"), 1)  # under another name (below)
    # Skipped for a lease held by a run of another slot (or a dead pod's): missed, made up.
    held = ran(at("11:40"), Outcome.SKIPPED, reason="lease held by other/pod (fence 4)")
    assert plan(spec, [held]).start == at("11:40")
    # Skipped because the slot was claimed: it ran in another cluster.
    claimed = ran(at("11:40"), Outcome.SKIPPED, reason=f"slot 1 {SLOT_CLAIMED_WORDS} other/pod (fence 4)")
    assert plan(spec, [claimed]).start is None
    manual = RunRecord(job="nightly-invoices-manual-bcdfg", outcome=Outcome.SUCCEEDED, reason="x",
                       manual=True, finished_at=at("11:45"))
    assert plan(spec, [manual]).start == at("11:40")


def test_slots_before_the_watermark_or_while_suspended_are_never_made_up() -> None:
    spec = parsed(catchUp={"policy": "All", "windowSeconds": 7200, "maxRuns": 100})
    suspended = plan(spec, [], suspended=True)
    assert suspended.start is None and suspended.settled_through == at("11:40")
    later = plan(spec, [], previous=suspended.to_status(None), now=NOW + timedelta(minutes=10))
    assert later.start == at("11:50")  # only what was missed after the suspension ended


def test_slots_before_the_guardedcronjob_existed_are_not_missed() -> None:
    spec = parsed(catchUp={"policy": "All", "windowSeconds": 7200, "maxRuns": 100})
    result = plan_catch_up(spec, runs=[], created_at=at("11:25"), last_schedule_time=None,
                           previous=None, busy=False, suspended=False, now=NOW)
    assert result.start == at("11:30")


# --- the Job for a slot ----------------------------------------------------------------

def cronjob() -> dict[str, Any]:
    from guardedcron.builders import build_cronjob

    built = build_cronjob(parsed(), DEFAULT_SETTINGS)
    built["metadata"]["uid"] = "cj-uid"
    return built


@pytest.mark.parametrize("kind", [contract.RUN_KIND_CATCH_UP, contract.RUN_KIND_BACKFILL])
def test_a_slot_job_is_a_scheduled_run_of_its_slot_marked_with_its_kind(kind: str) -> None:
    slot = epoch_minute(at("11:40"))
    job = build_slot_job(cronjob(), slot=slot, scheduled_at=format_time(at("11:40")), run_kind=kind,
                         attempt=2)
    letter = contract.ATTEMPT_LETTERS[kind]
    assert job["metadata"]["name"] == f"nightly-invoices-{slot}-{letter}2"
    assert contract.attempt_of(job["metadata"]["name"]) == (slot, kind, 2)
    # Not the controller's name for the slot: the guard is told the slot instead.
    assert contract.slot_from_job_name(job["metadata"]["name"], "nightly-invoices") is None
    [guard] = [c for c in job["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == contract.GUARD_CONTAINER]
    assert "--job-name" not in guard["args"] and "--cronjob" not in guard["args"]
    assert guard["args"][guard["args"].index("--slot") + 1] == str(slot)
    annotations = job["metadata"]["annotations"]
    assert annotations[contract.ANNOTATION_RUN_KIND] == kind
    assert job["spec"]["template"]["metadata"]["annotations"][contract.ANNOTATION_RUN_KIND] == kind
    assert not is_manual(job) and scheduled_slot(job) == slot
    assert classify_run(job, []).slot == slot
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"


# --- backfill ---------------------------------------------------------------------------

def test_the_annotation_is_parsed_and_bad_ones_are_refused_with_the_reason() -> None:
    request = parse_backfill("b1:2026-12-01T10:00:00Z/2026-12-01T11:00:00+00:00", now=NOW)
    assert (request.token, request.since, request.until) == ("b1", at("10:00"), at("11:00"))
    assert request.annotation() == "b1:2026-12-01T10:00:00Z/2026-12-01T11:00:00Z"
    for value, words in [
        ("2026-12-01/2026-12-02", "must be <token>:<since>/<until>"),
        (":2026-12-01T10:00:00Z/2026-12-01T11:00:00Z", "must be <token>:<since>/<until>"),
        ("a/b:2026-12-01T10:00:00Z/2026-12-01T11:00:00Z", "the token must not contain '/'"),
        ("b1:2026-12-01T10:00:00Z", "the range must be <since>/<until>"),
        ("b1:yesterday/2026-12-01T11:00:00Z", "since 'yesterday' is not an RFC 3339 time"),
        ("b1:2026-12-01T10:00:00/2026-12-01T11:00:00Z", "with an offset"),
        ("b1:2026-12-01T11:00:00Z/2026-12-01T10:00:00Z", "must be before until"),
        ("b1:2026-12-01T11:00:00Z/2026-12-02T10:00:00Z", "is in the future"),
    ]:
        with pytest.raises(BackfillRequestError, match=words.replace("(", r"\(")):
            parse_backfill(value, now=NOW)


def step(spec: ParsedSpec, annotation: str | None, previous: dict[str, Any] | None,
         runs: list[RunRecord], *, busy: bool = False, suspended: bool = False) -> Any:
    return advance_backfill(spec, annotation=annotation, previous=previous, runs=runs, busy=busy,
                            suspended=suspended, now=NOW)


ANNOTATION = "b1:2026-12-01T10:00:00Z/2026-12-01T10:40:00Z"  # slots 10:00, 10:10, 10:20, 10:30


def test_a_backfill_runs_its_slots_one_at_a_time_oldest_first_skipping_those_that_ran() -> None:
    spec = parsed()
    backfill = contract.RUN_KIND_BACKFILL
    runs = [ran(at("10:10"))]  # already ran here (the schedule's run): skipped without a Job
    first = step(spec, ANNOTATION, None, runs)
    assert (first.start, first.attempt) == (at("10:00"), 1) and first.notes[0][0] == "BackfillStarted"
    status = started(first.status, "nightly-invoices-x-b1")
    assert status["remaining"] == 4 and status["state"] == RUNNING
    # Its run is going: nothing more starts.
    going = [*runs, ran(at("10:00"), final=False, kind=backfill)]
    assert step(spec, ANNOTATION, status, going).start is None
    # It ran; 10:10 has a run already (skipped); 10:20 is next.
    runs.append(ran(at("10:00"), kind=backfill))
    second = step(spec, ANNOTATION, status, runs)
    assert second.start == at("10:20")
    assert (second.status["done"], second.status["skipped"], second.status["remaining"]) == (1, 1, 2)
    assert "running" not in second.status
    # The 10:20 run was skipped by its guard: the slot ran in another cluster.
    runs.append(ran(at("10:20"), Outcome.SKIPPED, kind=backfill, reason=CLAIMED))
    third = step(spec, ANNOTATION, second.status, runs)
    assert third.start == at("10:30") and third.status["skipped"] == 2
    runs.append(ran(at("10:30"), kind=backfill))
    last = step(spec, ANNOTATION, third.status, runs)
    assert last.start is None and last.status["state"] == COMPLETED
    assert (last.status["done"], last.status["skipped"], last.status["remaining"]) == (2, 2, 0)
    # One backfill per token: the same annotation again starts nothing.
    again = step(spec, ANNOTATION, last.status, [])
    assert again.start is None and again.status == last.status and again.notes == ()


def test_an_attempt_turned_away_by_a_held_lease_is_tried_again_later_at_most_six_times() -> None:
    """Two clusters backfilling (or catching up) the same slots at once: an attempt that
    found the lease held neither ran the slot nor claimed it, so it must be tried again,
    or the slot would run nowhere. Old code counted it as skipped and moved on."""
    spec = parsed()
    backfill = contract.RUN_KIND_BACKFILL
    status = step(spec, ANNOTATION, None, []).status
    turned_away = [ran(at("10:00"), Outcome.SKIPPED, kind=backfill, reason=LEASE_HELD,
                       finished=NOW - timedelta(seconds=10))]
    waiting = step(spec, ANNOTATION, status, turned_away)
    assert waiting.start is None and waiting.status["skipped"] == 0  # retried after 30 s
    later = advance_backfill(spec, annotation=ANNOTATION, previous=status, runs=turned_away, busy=False,
                             suspended=False, now=NOW + timedelta(seconds=25))
    assert (later.start, later.attempt) == (at("10:00"), 2)
    # A guard error (the database unreachable) is tried again too, each time after twice
    # the wait (30 s, 1, 2, 4, 8 min); after six attempts the slot is given up (skipped).
    tried = [*turned_away,
             ran(at("10:00"), Outcome.GUARD_ERROR, kind=backfill, attempt=2,
                 finished=NOW - timedelta(seconds=5))]
    waits = advance_backfill(spec, annotation=ANNOTATION, previous=status, runs=tried, busy=False,
                             suspended=False, now=NOW + timedelta(seconds=50))
    assert waits.start is None  # 60 s after the second attempt ended
    later = advance_backfill(spec, annotation=ANNOTATION, previous=status, runs=tried, busy=False,
                             suspended=False, now=NOW + timedelta(seconds=56))
    assert (later.start, later.attempt) == (at("10:00"), 3)
    tried += [ran(at("10:00"), Outcome.GUARD_ERROR, kind=backfill, attempt=n,
                  finished=NOW - timedelta(hours=1)) for n in (3, 4, 5, 6)]
    given_up = step(spec, ANNOTATION, status, tried)
    assert given_up.start == at("10:10") and given_up.status["skipped"] == 1


def test_catch_up_tries_a_turned_away_make_up_again() -> None:
    spec = parsed(catchUp={"policy": "Latest", "windowSeconds": 1500})  # 11:40 is the one due slot
    turned_away = ran(at("11:40"), Outcome.SKIPPED, kind=contract.RUN_KIND_CATCH_UP, reason=LEASE_HELD,
                      finished=NOW - timedelta(minutes=2))
    again = plan(spec, [turned_away])
    assert (again.start, again.attempt) == (at("11:40"), 2)
    claimed = ran(at("11:40"), Outcome.SKIPPED, kind=contract.RUN_KIND_CATCH_UP, reason=CLAIMED)
    assert plan(spec, [claimed]).start is None  # it ran in another cluster: settled
    # The controller's own run skipped because a run of another slot held the lease: no run
    # of 11:40 started anywhere, so it is missed and made up (the first attempt).
    held = plan(spec, [ran(at("11:40"), Outcome.SKIPPED, reason=LEASE_HELD)])
    assert (held.start, held.attempt) == (at("11:40"), 1)


def test_a_backfill_waits_while_another_run_is_active() -> None:
    result = step(parsed(), ANNOTATION, None, [], busy=True)
    assert result.start is None and result.status["next"] == format_time(at("10:00"))


def test_removing_the_annotation_or_suspending_stops_it_for_good() -> None:
    spec = parsed()
    status = started(step(spec, ANNOTATION, None, []).status, "nightly-invoices-x-b1")
    removed = step(spec, None, status, [])
    assert removed.status["state"] == STOPPED and "was removed" in removed.status["message"]
    assert step(spec, ANNOTATION, removed.status, []).start is None  # the same token: no restart
    paused = step(spec, ANNOTATION, status, [], suspended=True)
    assert paused.status["state"] == STOPPED and paused.start is None
    fresh = step(spec, "b2" + ANNOTATION[2:], removed.status, [])
    assert fresh.start == at("10:00") and fresh.status["token"] == "b2"


def test_a_bad_annotation_is_recorded_once_as_invalid() -> None:
    result = step(parsed(), "b1:not-a-range", None, [])
    assert result.start is None and result.status["state"] == INVALID
    assert result.notes[0][0] == "BackfillRefused"
    assert step(parsed(), "b1:not-a-range", result.status, []).notes == ()


def test_the_guard_of_a_slot_job_is_told_its_run_kind() -> None:
    slot = epoch_minute(at("11:40"))
    job = build_slot_job(cronjob(), slot=slot, scheduled_at=format_time(at("11:40")),
                         run_kind=contract.RUN_KIND_BACKFILL, attempt=1)
    [guard] = [c for c in job["spec"]["template"]["spec"]["initContainers"]
               if c["name"] == contract.GUARD_CONTAINER]
    assert guard["args"][-2:] == [contract.GUARD_RUN_KIND_FLAG, contract.RUN_KIND_BACKFILL]


# --- the guard's claim retention bounds backfill and catch-up (issue 36) -------------------
# The guard deletes slot claims older than its --retain-days (90); a slot whose claim is gone
# would run a second time. Backfill refuses such slots; catch-up's window stays far inside.

OLDEST = datetime(2026, 9, 3, 12, 1, tzinfo=UTC)  # NOW - 89 days (12:00:30), up to the minute
RETENTION_WORDS = "the guard keeps slot claims 90 days (its --retain-days)"


def test_a_backfill_since_older_than_the_guard_keeps_slot_claims_is_refused_naming_the_bound() -> None:
    assert oldest_backfill_slot(NOW) == OLDEST
    until = format_time(OLDEST + timedelta(hours=1))
    assert parse_backfill(f"b1:{format_time(OLDEST)}/{until}", now=NOW).since == OLDEST
    with pytest.raises(BackfillRequestError) as refused:
        parse_backfill(f"b1:{format_time(OLDEST - timedelta(minutes=1))}/{until}", now=NOW)
    assert RETENTION_WORDS in str(refused.value)
    assert f"older than {format_time(OLDEST)}, the oldest slot a backfill may run" in str(refused.value)


def test_a_backfill_annotation_past_the_claims_retention_is_recorded_invalid_and_starts_nothing() -> None:
    since = NOW - timedelta(days=100)  # its slots ran 100 days ago; their claims are gone
    annotation = f"b1:{format_time(since)}/{format_time(since + timedelta(minutes=30))}"
    result = step(parsed(), annotation, None, [])
    assert result.start is None and result.status["state"] == INVALID
    assert RETENTION_WORDS in result.status["message"] and format_time(OLDEST) in result.status["message"]
    assert result.notes == (("BackfillRefused", result.status["message"]),)
    assert step(parsed(), annotation, result.status, []).notes == ()  # once per token


def test_a_backfill_whose_next_slot_ages_past_the_claims_retention_stops_there() -> None:
    """A range inside the bound when it started can outlive it when its runs are slow."""
    spec = parsed()
    annotation = f"b1:{format_time(OLDEST)}/{format_time(OLDEST + timedelta(minutes=40))}"
    first = step(spec, annotation, None, [])
    assert first.start == OLDEST.replace(minute=10)
    runs = [ran(OLDEST.replace(minute=10), kind=contract.RUN_KIND_BACKFILL)]
    a_day_later = advance_backfill(spec, annotation=annotation, previous=first.status, runs=runs,
                                   busy=False, suspended=False, now=NOW + timedelta(days=1))
    assert a_day_later.start is None and a_day_later.status["state"] == STOPPED
    assert a_day_later.status["done"] == 1
    assert RETENTION_WORDS in a_day_later.status["message"]
    assert a_day_later.notes[-1][0] == "BackfillStopped"


def crd_catch_up_window_maximum() -> int:
    crd = yaml.safe_load((REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == contract.API_VERSION]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    maximum: int = spec["properties"]["catchUp"]["properties"]["windowSeconds"]["maximum"]
    return maximum


def test_the_catch_up_window_can_never_reach_past_the_slot_claims_backfill_may_rely_on() -> None:
    """Catch-up makes up slots at most windowSeconds old: a window raised past the
    backfill bound would make up slots whose claims the guard may have deleted."""
    bound = timedelta(days=contract.SLOT_CLAIM_RETAIN_DAYS - contract.SLOT_CLAIM_MARGIN_DAYS)
    assert timedelta(seconds=crd_catch_up_window_maximum()) <= bound
    assert timedelta(seconds=MAX_CATCH_UP_WINDOW_SECONDS) <= bound
    oldest_due = NOW - timedelta(seconds=MAX_CATCH_UP_WINDOW_SECONDS)
    assert oldest_due >= oldest_backfill_slot(NOW)


def test_every_guard_keeps_slot_claims_the_days_the_operator_relies_on() -> None:
    """The builders never pass --retain-days, so the guard's default is the retention."""
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    guard_commands.add_parser(commands, "acquire", "acquire")
    assert commands.choices["acquire"].get_default("retain_days") == str(contract.SLOT_CLAIM_RETAIN_DAYS)
    slot = epoch_minute(at("11:40"))
    slot_job = build_slot_job(cronjob(), slot=slot, scheduled_at=format_time(at("11:40")),
                              run_kind=contract.RUN_KIND_BACKFILL, attempt=1)
    for pod in (cronjob()["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                slot_job["spec"]["template"]["spec"]):
        for container in [*pod.get("initContainers", ()), *pod["containers"]]:
            assert not any(str(arg).startswith("--retain-days") for arg in container.get("args") or ())



@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["set", "dry-run"])
def test_the_cli_refuses_a_since_past_the_claims_retention_before_any_request(
        closed_kubeconfig: Path, capsys: pytest.CaptureFixture[str], dry_run: tuple[str, ...]) -> None:
    since = datetime.now(UTC) - timedelta(days=100)
    before = oldest_backfill_slot(datetime.now(UTC))
    code = main(["backfill", "nightly-invoices", "-n", "billing", "--kubeconfig", str(closed_kubeconfig),
                 "--since", format_time(since), "--until", format_time(since + timedelta(hours=1)),
                 *dry_run])
    after = oldest_backfill_slot(datetime.now(UTC))
    out, err = capsys.readouterr()
    assert code == contract.EXIT_USAGE, err
    assert out == "" and RETENTION_WORDS in err
    named = re.search(r"older than (\S+), the oldest slot a backfill may run", err)
    assert named is not None, err
    oldest = parse_time(named.group(1))
    assert oldest is not None and before <= oldest <= after
