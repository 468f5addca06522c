"""Backfill: the slots of a past time range, run one at a time, oldest first (pure;
docs/design.md, "Catch-up and backfill").

Asked for with the annotation `guardedcron.io/backfill=<token>:<since>/<until>` (what
`guardedcron backfill` sets): the schedule's fire times t with since <= t < until. One
backfill per token: status.backfill records the token, and a token that has finished,
stopped or was refused is never started again; a new token starts a new backfill.
Removing the annotation, or suspending the job (spec.suspend, or after failures),
stops a running backfill for good.

Each slot's run is a Job named `<cronjob>-<slot>`, so its guard claims that slot: a
slot with a run here is skipped without a Job, and one that ran in another cluster
sharing the database is skipped by its guard. The next run starts once the previous
one has finished and no other run of the job is active here.

The guard keeps a claim `contract.SLOT_CLAIM_RETAIN_DAYS` (its `--retain-days`), and a
slot whose claim is gone would run again: a range whose `since` is older than
`oldest_backfill_slot(now)` is refused, and a backfill that reaches a slot older than it
(its runs took that long) stops there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from guardedcron import contract
from guardedcron.spec import ParsedSpec
from guardedcron.status.runs import HELD_LEASE, RunRecord
from guardedcron.status.slots import SlotState, is_attempt_of_kind, next_attempt, slot_state
from guardedcron.status.times import epoch_minute, format_time, parse_time

STATUS_KEY: Final = "backfill"
# Slots in one backfill at most: each is a Job and a line of progress, and the walk over
# them is repeated in each pass.
MAX_BACKFILL_SLOTS: Final = 1000
RUNNING: Final = "Running"
COMPLETED: Final = "Completed"
STOPPED: Final = "Stopped"
INVALID: Final = "Invalid"
# status.backfill's counters: slots whose backfill run held the lease, and the others.
DONE: Final = "done"
SKIPPED: Final = "skipped"
_TOKEN_SEPARATOR: Final = ":"
_RANGE_SEPARATOR: Final = "/"


class BackfillRequestError(ValueError):
    """An annotation value (or CLI arguments) that cannot be a backfill; says why."""


@dataclass(frozen=True)
class BackfillRequest:
    token: str
    since: datetime  # UTC, inclusive
    until: datetime  # UTC, exclusive

    def annotation(self) -> str:
        return (f"{self.token}{_TOKEN_SEPARATOR}{format_time(self.since)}"
                f"{_RANGE_SEPARATOR}{format_time(self.until)}")


def parse_backfill(value: str, *, now: datetime) -> BackfillRequest:
    """`<token>:<since>/<until>` with RFC 3339 times (an offset or Z required); raises
    BackfillRequestError naming the part that is wrong."""
    token, separator, window = value.partition(_TOKEN_SEPARATOR)
    if not separator or not token.strip():
        raise BackfillRequestError(
            f"must be <token>:<since>/<until> (e.g. b1:2026-11-30T00:00:00Z/2026-12-01T00:00:00Z), "
            f"not {value[:80]!r}")
    problem = token_problem(token)
    if problem is not None:
        raise BackfillRequestError(f"the token {problem}")
    since_text, separator, until_text = window.partition(_RANGE_SEPARATOR)
    if not separator:
        raise BackfillRequestError(f"the range must be <since>/<until>, not {window[:80]!r}")
    since = _instant("since", since_text)
    until = _instant("until", until_text)
    return checked_request(token, since, until, now=now)


def checked_request(token: str, since: datetime, until: datetime, *, now: datetime) -> BackfillRequest:
    if since >= until:
        raise BackfillRequestError(
            f"since ({format_time(since)}) must be before until ({format_time(until)})")
    if until > now:
        raise BackfillRequestError(
            f"until ({format_time(until)}) is in the future (now {format_time(now)}): a backfill runs "
            "past slots only; the schedule runs the coming ones")
    oldest = oldest_backfill_slot(now)
    if since < oldest:
        raise BackfillRequestError(f"since ({format_time(since)}) {_past_claims(oldest)}")
    return BackfillRequest(token=token, since=since, until=until)


def oldest_backfill_slot(now: datetime) -> datetime:
    """The oldest slot a backfill may start at `now`: the guard's claims reach back
    SLOT_CLAIM_RETAIN_DAYS, less SLOT_CLAIM_MARGIN_DAYS (contract.py says why), rounded
    up to a whole minute (slots are minutes; the message shows it exactly)."""
    bound = now - timedelta(days=contract.SLOT_CLAIM_RETAIN_DAYS - contract.SLOT_CLAIM_MARGIN_DAYS)
    minute = bound.replace(second=0, microsecond=0)
    return minute if minute == bound else minute + timedelta(minutes=1)


def _past_claims(oldest: datetime) -> str:
    return (f"is older than {format_time(oldest)}, the oldest slot a backfill may run: the guard "
            f"keeps slot claims {contract.SLOT_CLAIM_RETAIN_DAYS} days (its --retain-days), and a "
            "slot whose claim is gone would run a second time")


def token_problem(token: str) -> str | None:
    if len(token) > contract.NAME_MAX:
        return f"is {len(token)} characters long; at most {contract.NAME_MAX}"
    if contract.CONTROL_CHARACTERS.search(token) or _RANGE_SEPARATOR in token:
        return "must not contain '/' or control characters"
    return None


def backfill_slots(parsed: ParsedSpec, since: datetime, until: datetime,
                   *, limit: int = MAX_BACKFILL_SLOTS + 1) -> list[datetime]:
    """The schedule's fire times in [since, until), oldest first, at most `limit`."""
    spec = parsed.spec
    slots: list[datetime] = []
    t = spec.schedule.next_after(since - timedelta(microseconds=1), spec.zone)
    while t is not None and t < until and len(slots) < limit:
        slots.append(t)
        t = spec.schedule.next_after(t, spec.zone)
    return slots


@dataclass(frozen=True)
class BackfillStep:
    status: dict[str, Any] | None  # status.backfill to write (None: none)
    start: datetime | None = None  # the slot to start a Job for now
    attempt: int = 1  # its attempt number (status/slots.py)
    # (what happened, for the Event): BackfillStarted, BackfillCompleted, BackfillStopped, BackfillRefused
    notes: tuple[tuple[str, str], ...] = field(default=())


def advance_backfill(parsed: ParsedSpec, *, annotation: str | None,
                     previous: Mapping[str, Any] | None, runs: Iterable[RunRecord],
                     busy: bool, suspended: bool, now: datetime) -> BackfillStep:
    """Where the backfill stands after this pass, and the slot to start now, if any."""
    prev = dict(previous) if isinstance(previous, Mapping) and previous.get("token") else None
    if annotation is None or not annotation.strip():
        if prev is not None and prev.get("state") == RUNNING:
            return _stop(prev, f"the annotation {contract.ANNOTATION_BACKFILL} was removed")
        return BackfillStep(status=prev)
    token = annotation.partition(_TOKEN_SEPARATOR)[0]
    if prev is not None and prev.get("token") == token:
        if prev.get("state") != RUNNING:
            return BackfillStep(status=prev)  # one backfill per token
        state = prev
        notes: tuple[tuple[str, str], ...] = ()
    else:
        try:
            request = parse_backfill(annotation, now=now)
        except BackfillRequestError as error:
            message = f"annotation {contract.ANNOTATION_BACKFILL}: {error}"
            return BackfillStep(status={"token": token[:contract.NAME_MAX], "state": INVALID,
                                        "message": message},
                                notes=(("BackfillRefused", message),))
        slots = backfill_slots(parsed, request.since, request.until)
        if len(slots) > MAX_BACKFILL_SLOTS:
            message = (f"annotation {contract.ANNOTATION_BACKFILL}: the range holds more than "
                       f"{MAX_BACKFILL_SLOTS} slots of the schedule; split it into smaller backfills")
            return BackfillStep(status={"token": token, "state": INVALID, "message": message},
                                notes=(("BackfillRefused", message),))
        state = {"token": token, "since": format_time(request.since), "until": format_time(request.until),
                 "state": RUNNING, DONE: 0, SKIPPED: 0}
        if slots:
            state["next"] = format_time(slots[0])
        notes = (("BackfillStarted", f"backfill {token!r}: {len(slots)} slots from "
                  f"{format_time(request.since)} until {format_time(request.until)}"),)
    if suspended:
        return _stop(state, "the job is suspended", notes)
    return _progress(parsed, state, runs, busy=busy, now=now, notes=notes)


def _progress(parsed: ParsedSpec, state: dict[str, Any], runs: Iterable[RunRecord], *, busy: bool,
              now: datetime, notes: tuple[tuple[str, str], ...]) -> BackfillStep:
    records = list(runs)
    until, cursor = parse_time(state.get("until")), parse_time(state.get("next"))
    remaining = backfill_slots(parsed, cursor, until) if cursor is not None and until is not None else []
    # Slots decided since the last pass are counted once, as the cursor passes them.
    while remaining:
        slot = epoch_minute(remaining[0])
        where = slot_state(records, slot, now=now)
        if where is SlotState.RAN and any(
                run.slot == slot and run.outcome in HELD_LEASE
                and is_attempt_of_kind(run.job, contract.RUN_KIND_BACKFILL) for run in records):
            state[DONE] = _count(state, DONE) + 1
        elif where in (SlotState.RAN, SlotState.SETTLED):
            # Run here before (by the schedule, a make-up or an earlier backfill), claimed
            # by a run in another cluster, or given up after MAX_ATTEMPTS attempts.
            state[SKIPPED] = _count(state, SKIPPED) + 1
        else:
            break
        state.pop("running", None)
        remaining.pop(0)
    if not remaining:
        state.pop("next", None)
        state["remaining"] = 0
        state["state"] = COMPLETED
        return BackfillStep(status=state, notes=(*notes, ("BackfillCompleted", (
            f"backfill {state['token']!r} completed: {state.get(DONE, 0)} runs, "
            f"{state.get(SKIPPED, 0)} slots skipped (already run, here or in another cluster)"))))
    state["next"] = format_time(remaining[0])
    state["remaining"] = len(remaining)
    slot = epoch_minute(remaining[0])
    if busy or slot_state(records, slot, now=now) is not SlotState.OPEN:
        return BackfillStep(status=state, notes=notes)  # its run goes on, or waits to be retried
    oldest = oldest_backfill_slot(now)
    if remaining[0] < oldest:
        # The range was inside the bound when it started; its runs took so long that this
        # slot's claim may be deleted by now.
        return _stop(state, f"its next slot {format_time(remaining[0])} {_past_claims(oldest)}", notes)
    return BackfillStep(status=state, start=remaining[0], attempt=next_attempt(records, slot), notes=notes)


def stopped(state: Mapping[str, Any], why: str) -> BackfillStep:
    """status.backfill once its next Job cannot be made (the CronJob or a refusal that
    asking again would repeat): stopped for good, with the reason."""
    return _stop(state, why)


def started(state: Mapping[str, Any], job_name: str) -> dict[str, Any]:
    """status.backfill once the Job for its `next` slot exists."""
    return {**state, "running": job_name}


def _stop(state: Mapping[str, Any], why: str, notes: tuple[tuple[str, str], ...] = ()) -> BackfillStep:
    stopped = {k: v for k, v in state.items() if k not in ("next",)}
    stopped["state"] = STOPPED
    stopped["message"] = f"stopped: {why}"
    message = f"backfill {state.get('token')!r} {stopped['message']}"
    return BackfillStep(status=stopped, notes=(*notes, ("BackfillStopped", message)))


def _count(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _instant(what: str, text: str) -> datetime:
    at = parse_time(text.strip())
    if at is None:
        raise BackfillRequestError(f"{what} {text[:40]!r} is not an RFC 3339 time with an offset "
                                   "(e.g. 2026-11-30T00:00:00Z)")
    return at
