"""`guardedcron acquire | renew | release | keep`: the guard as a command.

Contract (docs/design.md, "The guard"): one JSON line on stdout, one-line reasons on
stderr, exit codes from guardedcron.contract. Input is checked before any database
call, so bad input changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardedcron.contract import (
    ACQUIRE_CALL_SECONDS,
    BIGINT_MAX,
    ENV_CHECK_IN_URL,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_ACQUIRED,
    EXIT_OK,
    HOLDER_CALL_SECONDS,
    KEEPER_CHECK_IN_FLAG,
    KEY_ACQUIRED,
    KEY_EXIT_CODE,
    KEY_FENCE,
    KEY_HOLDER,
    KEY_LOCK,
    KEY_LOCKED_UNTIL,
    KEY_OUTCOME,
    KEY_REASON,
    KEY_RELEASED,
    KEY_REMAINING_SECONDS,
    KEY_RENEWED,
    KEY_REQUESTER,
    KEY_RUN_ID,
    KEY_SENT_MONOTONIC,
    KEY_SLOT,
    LOST_FILE,
    MAX_LEASE_SECONDS,
    RENEWALS_PER_LEASE,
    RUN_KIND_BACKFILL,
    RUN_KIND_CATCH_UP,
    RUN_KIND_SKIPPED_TIME,
    SLOT_CLAIM_RETAIN_DAYS,
    AcquireReason,
    GuardOutcome,
    ReleaseOutcome,
    SlotOutOfRange,
    slot_from_job_name,
)
from guardedcron.contract import GUARD_RUN_KIND_FLAG as RUN_KIND_FLAG
from guardedcron.guard.errors import BadInput, GuardError
from guardedcron.guard.redaction import looks_like_dsn, redact

if TYPE_CHECKING:
    from guardedcron.guard.check_in import CheckIn
    from guardedcron.guard.outputs import RunContext

# libpq's connect_timeout: longer than this is a hang, not a wait for a slow network.
MAX_CONNECT_TIMEOUT_SECONDS = 300
# How much of a bad value a message quotes: enough to recognise it, never a wall of text.
SHOWN_INPUT_MAX = 40
# How much of an error's text the history row of a run that could not start keeps.
GIVEN_BACK_REASON_MAX = 300
_INTEGER = re.compile(r"[+-]?[0-9]+")


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--lock", required=True, help="the lease name shared by every copy of the job")
    parser.add_argument("--holder", required=True, help="who is asking, e.g. namespace/pod")
    if name == "acquire":
        parser.add_argument("--lease-seconds", required=True, help="how long the lease lasts")
        parser.add_argument(
            "--min-hold-seconds", default="0", help="keep the lease at least this long, even after release"
        )
        slot = parser.add_mutually_exclusive_group()
        slot.add_argument("--slot", help="the scheduled minute (minutes since the epoch)")
        slot.add_argument(
            "--job-name", help="derive the slot from a CronJob-made Job name <cronjob>-<minutes>"
        )
        parser.add_argument("--cronjob", help="with --job-name: the CronJob's name")
        parser.add_argument(
            "--time-zone", help="the job's IANA time zone: lease.json gives the scheduled time in it"
        )
        parser.add_argument(
            "--repeated-time",
            choices=["Twice", "Once"],
            default="Twice",
            help="Once: a wall-clock minute the clock shows twice claims one slot (needs --time-zone)",
        )
        parser.add_argument(
            RUN_KIND_FLAG,
            choices=[RUN_KIND_CATCH_UP, RUN_KIND_BACKFILL, RUN_KIND_SKIPPED_TIME],
            help="why the operator started this Job for a past slot (for lease.json); "
            f"{RUN_KIND_SKIPPED_TIME}: --slot is a skipped wall time's key (needs --time-zone)",
        )
        parser.add_argument("--out", type=folder, help="folder for the fence and lease.json files")
        parser.add_argument("--retain-days", default=str(SLOT_CLAIM_RETAIN_DAYS),
                            help="run history and slot claims kept, days (backfills rely on the default)")
        parser.add_argument("--retain-runs", default="10000", help="run history kept, winning runs per lock")
        parser.set_defaults(run=run_acquire)
    elif name == "renew":
        parser.add_argument("--fence", required=True, help="the fencing token you hold")
        parser.add_argument("--lease-seconds", required=True, help="new lease length from now")
        parser.set_defaults(run=run_renew)
    elif name == "release":
        parser.add_argument("--fence", required=True, help="the fencing token you hold")
        parser.add_argument(
            "--outcome",
            default=ReleaseOutcome.FINISHED.value,
            choices=[outcome.value for outcome in ReleaseOutcome],
            help="what the run's history row records (default: finished)",
        )
        parser.set_defaults(run=run_release)
    elif name == "keep":
        fence = parser.add_mutually_exclusive_group(required=True)
        fence.add_argument("--fence", help="the fencing token you hold")
        fence.add_argument(
            "--fence-file", type=Path, help="read the token from this file (as written by acquire --out)"
        )
        parser.add_argument(
            "--lease-seconds",
            required=True,
            help=f"lease length; renewed every 1/{RENEWALS_PER_LEASE} of it",
        )
        parser.add_argument("--out", type=folder, help="folder for the `lost` marker")
        parser.add_argument(
            "--on-lost",
            choices=["exit", "wait"],
            default="exit",
            help="when the lease is lost: exit 76 at once (default) or wait for SIGTERM",
        )
        parser.add_argument(
            KEEPER_CHECK_IN_FLAG,
            action="store_true",
            help=f"ping the check-in URL in ${ENV_CHECK_IN_URL} (start, finish, fail; "
            "never in the arguments: it is a secret)",
        )
        parser.set_defaults(run=run_keep)
    add_connection_options(parser)


def folder(text: str) -> Path:
    """An --out argument; an empty one (an unset variable) would mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder, got ''")
    return Path(text)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: $GUARDEDCRON_DSN)")
    parser.add_argument("--connect-timeout", default="5", help="seconds to wait for the database (default 5)")


# --- input parsing: every check before the database is touched -----------------------
def shown(text: str) -> str:
    """A bad value as a message quotes it: one line, short (credentials are hidden later)."""
    if len(text) > SHOWN_INPUT_MAX:
        return repr(text[:SHOWN_INPUT_MAX]) + f" (+{len(text) - SHOWN_INPUT_MAX} characters)"
    return repr(text)


def parse_number(what: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise BadInput(f"{what} must be a number, got {shown(text)}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise BadInput(f"{what} must be a finite number, got {shown(text)}")
    return value


def parse_seconds(what: str, text: str, *, minimum: float, maximum: float) -> float:
    value = parse_number(what, text)
    if not minimum <= value <= maximum:
        raise BadInput(f"{what} must be from {minimum:g} to {maximum:g} seconds, got {shown(text)}")
    return value


def parse_integer(what: str, text: str, *, minimum: int, maximum: int) -> int:
    """An integer in [minimum, maximum]: the range of the PostgreSQL column it goes to, or
    less. Checked on the digits, so that no size of input costs more than a comparison."""
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise BadInput(f"{what} must be an integer from {minimum} to {maximum}, got {shown(text)}")
    # int() gets the significant digits only: with thousands of leading zeros it would raise.
    digits = stripped.lstrip("+-").lstrip("0") or "0"
    sign = -1 if stripped.startswith("-") else 1
    value = sign * int(digits) if len(digits) <= len(str(BIGINT_MAX)) else None
    if value is None or not minimum <= value <= maximum:
        raise BadInput(f"{what} must be from {minimum} to {maximum}, got {shown(text)}")
    return value


def parse_fence(what: str, text: str) -> int:
    return parse_integer(what, text, minimum=1, maximum=BIGINT_MAX)


def check_names(args: argparse.Namespace) -> None:
    check_name_argument("--lock", args.lock)
    check_name_argument("--holder", args.holder)


def check_name_argument(what: str, value: str) -> None:
    """A lock or holder name: the library's rules, and text that can reach the database
    and the messages safely (no bytes that are not UTF-8, no connection string)."""
    from guardedcron.guard.lease import check_name

    check_name(what, value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{what} must be UTF-8 text; it holds bytes that are not") from None
    if looks_like_dsn(value):
        raise BadInput(
            f"{what} looks like a database connection string (not shown); "
            "give the database with --dsn or $GUARDEDCRON_DSN"
        )


def checked_dsn(args: argparse.Namespace) -> str:
    """The DSN to use, parsed before anything starts, so that a typo is exit 64 at once."""
    from psycopg.conninfo import conninfo_to_dict

    from guardedcron.guard.connection import resolve_dsn

    dsn = resolve_dsn(args.dsn)
    try:
        conninfo_to_dict(dsn)
    except Exception:  # any parser complaint may quote the DSN: say only that it is bad
        raise BadInput("the database DSN cannot be parsed (value not shown)") from None
    return dsn


def check_out_dir(option: str, path: Path) -> None:
    """Refuse an --out folder that cannot be written before the lease is taken, not after."""
    try:
        if "\x00" in str(path):
            raise ValueError("NUL in the path")  # Path.exists() would answer False, not fail
        probe = path
        while not probe.exists():
            probe = probe.parent
        writable = probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    except (OSError, ValueError):
        writable = False
    if not writable:
        raise BadInput(f"{option} {shown(str(path))} is not a folder this guard can write")


def parse_slot(args: argparse.Namespace) -> int | None:
    if args.slot is not None:
        return parse_integer("--slot", args.slot, minimum=0, maximum=BIGINT_MAX)
    if args.job_name is None:
        if args.cronjob is not None:
            raise BadInput("--cronjob goes with --job-name")
        return None
    if not args.cronjob:
        raise BadInput("--job-name needs --cronjob to tell a scheduled Job from a manual one")
    try:
        return slot_from_job_name(args.job_name, args.cronjob)
    except SlotOutOfRange as exc:
        raise BadInput(
            f"the scheduled minute in --job-name must be from 0 to {BIGINT_MAX}, got {shown(exc.digits)}"
        ) from None


def run_context_of(args: argparse.Namespace, scheduled_slot: int | None) -> RunContext:
    """The run context (the slot to claim and what lease.json tells the workload), from
    --time-zone, --repeated-time and --run-kind; BadInput for a zone that does not exist."""
    from guardedcron.guard.outputs import RunContext

    zone = None
    if args.time_zone is not None:  # the schedule package only when needed: start-up time
        from guardedcron.schedule import ScheduleError, load_time_zone

        try:
            zone = load_time_zone(args.time_zone)
        except ScheduleError as exc:
            raise BadInput(f"--time-zone {shown(args.time_zone)} is not an IANA time zone this "
                           f"guard knows ({exc.__class__.__name__})") from None
    if args.repeated_time == "Once" and (zone is None or scheduled_slot is None):
        raise BadInput("--repeated-time Once needs --time-zone and a slot (--slot or --job-name)")
    if args.run_kind == RUN_KIND_SKIPPED_TIME:
        # The claim is the wall time's key (claimed_slot_of); lease.json's scheduled time
        # is the minute the run was due, the first after the jump.
        return RunContext(scheduled_slot=skipped_time_due(scheduled_slot, zone),
                          time_zone=args.time_zone, zone=zone, once_per_wall_minute=False,
                          run_kind=args.run_kind)
    return RunContext(scheduled_slot=scheduled_slot, time_zone=args.time_zone, zone=zone,
                      once_per_wall_minute=args.repeated_time == "Once", run_kind=args.run_kind)


def skipped_time_due(slot: int | None, zone: tzinfo | None) -> int:
    """The minute a skipped wall time's run is due (docs/design.md, "Daylight-saving
    policy"); BadInput unless `slot` is the key of a wall time `zone` skips."""
    from guardedcron.schedule.dst import next_valid_minute, skipped_wall_time, slot_of

    if slot is None or zone is None:
        raise BadInput(f"{RUN_KIND_FLAG} {RUN_KIND_SKIPPED_TIME} needs --time-zone and --slot")
    try:
        wall = skipped_wall_time(slot)
    except ValueError as exc:
        raise BadInput(f"--slot: {exc}") from None
    due = next_valid_minute(wall, zone)
    if due is None:
        raise BadInput(f"--slot {slot} stands for {wall.isoformat(timespec='minutes')}, a wall time "
                       "the clock of --time-zone does not skip")
    return slot_of(due)


def claimed_slot_of(args: argparse.Namespace, context: RunContext,
                    scheduled_slot: int | None) -> int | None:
    """The slot claimed in the database: a skipped wall time's key as given, else the run
    context's (repeatedTime Once moves a repeated minute to its first showing)."""
    return scheduled_slot if args.run_kind == RUN_KIND_SKIPPED_TIME else context.claimed_slot


def planned_run(args: argparse.Namespace, scheduled_slot: int | None) -> tuple[dict[str, Any], int | None]:
    """lease.json's run-context fields and the slot to claim, all worked out before the
    database is touched: a minute that has no date (past 9999-12-31T23:59, in UTC or in
    --time-zone) is bad input, never a lease won for a run whose files cannot be written."""
    try:
        context = run_context_of(args, scheduled_slot)
        return context.fields(), claimed_slot_of(args, context, scheduled_slot)
    except (OverflowError, ValueError, OSError):  # what datetime raises past its range
        option = "--slot" if args.slot is not None else "--job-name"
        where = f" in --time-zone {shown(args.time_zone)}" if args.time_zone is not None else ""
        raise BadInput(f"{option} gives minute {scheduled_slot}, which has no date{where} "
                       "(dates end at 9999-12-31T23:59)") from None


def connect_timeout(args: argparse.Namespace) -> float:
    value = parse_number("--connect-timeout", args.connect_timeout)
    if not 0 < value <= MAX_CONNECT_TIMEOUT_SECONDS:
        raise BadInput(
            f"--connect-timeout must be more than 0 and at most {MAX_CONNECT_TIMEOUT_SECONDS} "
            f"seconds, got {shown(args.connect_timeout)}"
        )
    return value


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(redact(json.dumps(payload, sort_keys=True)) + "\n")
    sys.stdout.flush()


def say(command: str, message: str) -> None:
    sys.stderr.write(redact(f"guardedcron {command}: {message}") + "\n")
    sys.stderr.flush()


# --- commands ---------------------------------------------------------------------
def run_acquire(args: argparse.Namespace) -> int:
    from guardedcron.guard.outputs import write_termination_message

    try:
        return _acquire(args)
    except GuardError as exc:
        say("acquire", str(exc))
        write_termination_message(
            {
                KEY_OUTCOME: GuardOutcome.ERROR,
                KEY_EXIT_CODE: exc.exit_code,
                KEY_LOCK: args.lock,
                KEY_HOLDER: args.holder,
                KEY_REASON: str(exc),
            }
        )
        return exc.exit_code


def _acquire(args: argparse.Namespace) -> int:
    from guardedcron.guard import lease as lease_ops
    from guardedcron.guard.connection import call_with_deadline, connect
    from guardedcron.guard.outputs import write_termination_message
    from guardedcron.guard.replication import replication_of

    check_names(args)
    scheduled_slot = parse_slot(args)
    run_fields, claimed_slot = planned_run(args, scheduled_slot)
    request = lease_ops.AcquireRequest(
        lock=args.lock,
        holder=args.holder,
        lease_seconds=lease_seconds(args),
        min_hold_seconds=parse_seconds(
            "--min-hold-seconds", args.min_hold_seconds, minimum=0, maximum=MAX_LEASE_SECONDS
        ),
        slot=claimed_slot,
        retain_days=parse_integer(
            "--retain-days", args.retain_days, minimum=1, maximum=lease_ops.MAX_RETAIN_DAYS
        ),
        retain_runs=parse_integer(
            "--retain-runs", args.retain_runs, minimum=1, maximum=lease_ops.MAX_RETAIN_RUNS
        ),
    )
    timeout = connect_timeout(args)
    if args.out is not None:
        check_out_dir("--out", args.out)
    dsn = checked_dsn(args)
    with connect(dsn, timeout) as conn:
        sent = time.monotonic()  # before both calls: the keeper's first deadline only gets earlier
        replication, result = call_with_deadline(
            conn, dsn, ACQUIRE_CALL_SECONDS, lambda c: (replication_of(c), lease_ops.acquire(c, request))
        )
    if replication is not None and replication.warning():
        say("acquire", str(replication.warning()))  # a failover of this server can lose the win
    summary = {
        KEY_ACQUIRED: result.acquired,
        KEY_REASON: result.reason,
        KEY_LOCK: request.lock,
        KEY_HOLDER: result.holder,
        KEY_FENCE: result.fence,
        KEY_SLOT: request.slot,
        KEY_LOCKED_UNTIL: iso(result.locked_until),
        KEY_RUN_ID: result.run_id,
    }
    if not result.acquired:
        emit(summary)
        say("acquire", _skip_message(request, result))
        write_termination_message(
            {KEY_OUTCOME: GuardOutcome.SKIPPED, KEY_REQUESTER: request.holder, **summary}
        )
        return EXIT_NOT_ACQUIRED
    if args.out is not None:
        hand_over(args.out, {**summary, **keeper_timing(sent, result), **run_fields},
                  lambda why: give_back(dsn, timeout, request, result.fence, why))
    emit(summary)  # only now: `acquired: true` means the run can start
    write_termination_message({KEY_OUTCOME: GuardOutcome.ACQUIRED, **summary})
    return EXIT_OK


class LeaseFilesNotWritten(GuardError):
    """A won lease whose files could not be written: the run cannot start (exit 70, as an
    environment the checks did not foresee), and the lease was given back."""

    exit_code = EXIT_INTERNAL


class Interrupted(GuardError):
    """SIGINT while the files of a won lease were being written (exit 130)."""

    exit_code = EXIT_INTERRUPTED


def hand_over(out: Path, lease: dict[str, Any], release: Callable[[str], str]) -> None:
    """Write the files of a won lease, which the workload waits for. When they cannot be
    written, or SIGINT comes first, nobody will run: the lease is given back at once
    rather than held until it ends, and the error says what became of it."""
    from guardedcron.guard.outputs import write_lease_files

    try:
        write_lease_files(out, lease)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted (SIGINT) before the lease files were written; "
                          f"{release('interrupted before the lease files were written')}") from None
    except Exception as exc:  # whatever failed (a full disk, a vanished volume), nothing runs
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:GIVEN_BACK_REASON_MAX]
        raise LeaseFilesNotWritten(
            f"won lock {lease[KEY_LOCK]} (fence {lease[KEY_FENCE]}) but could not write the lease "
            f"files to {shown(str(out))} ({why}); {release('lease files not written: ' + why)}"
        ) from None


def give_back(dsn: str, timeout: float, request: Any, fence: int, why: str) -> str:
    """Release a won lease whose run cannot start, its history row recorded `failed` with
    `why`; says what became of the lease (and of the slot, which stays claimed: the schema
    has no way to unclaim one, and the history row tells why it did not run)."""
    from guardedcron.guard import lease as lease_ops
    from guardedcron.guard.connection import call_with_deadline, connect

    def release(conn: Any) -> lease_ops.LeaseState:
        return lease_ops.release(conn, request.lock, request.holder, fence, ReleaseOutcome.FAILED.value, why)

    try:
        with connect(dsn, timeout) as conn:
            released = call_with_deadline(conn, dsn, HOLDER_CALL_SECONDS, release).ok
    except Exception as exc:  # the error being reported matters more than this one
        return f"the lease could not be released ({type(exc).__name__}): it ends when its time runs out"
    if not released:
        return "the lease was no longer ours to release"
    slot = "" if request.slot is None else f"; slot {request.slot} stays claimed"
    return f"the lease was released and its run recorded failed{slot}"


def keeper_timing(sent: float, result: Any) -> dict[str, float]:
    """For the keeper's first deadline (docs/design.md, "The keeper's timing"): when this
    acquire was sent, on the monotonic clock the pod's containers share, and how long the
    database said the lease lasts from its answer."""
    remaining = (result.locked_until - result.db_now).total_seconds()
    return {KEY_SENT_MONOTONIC: sent, KEY_REMAINING_SECONDS: remaining}


def _skip_message(request: Any, result: Any) -> str:
    if result.reason == AcquireReason.SLOT_CLAIMED:
        return (
            f"slot {request.slot} of {request.lock} already ran under {result.holder} "
            f"(fence {result.fence}); skipping"
        )
    if result.reason == AcquireReason.ROW_BUSY:
        return f"lease {request.lock} is locked by an in-flight fenced write of its previous holder; skipping"
    return (
        f"lease {request.lock} is held by {result.holder} (fence {result.fence}) "
        f"until {iso(result.locked_until)}; skipping"
    )


def run_renew(args: argparse.Namespace) -> int:
    from guardedcron.guard import lease as lease_ops

    def renew(conn: Any) -> lease_ops.LeaseState:
        return lease_ops.renew(conn, args.lock, args.holder, fence, seconds)

    try:
        fence = parse_fence("--fence", args.fence)
        seconds = lease_seconds(args)
    except GuardError as exc:
        say("renew", str(exc))
        return exc.exit_code
    return _holder_call("renew", KEY_RENEWED, args, renew)


def run_release(args: argparse.Namespace) -> int:
    from guardedcron.guard import lease as lease_ops

    def release(conn: Any) -> lease_ops.LeaseState:
        return lease_ops.release(conn, args.lock, args.holder, fence, args.outcome)

    try:
        fence = parse_fence("--fence", args.fence)
    except GuardError as exc:
        say("release", str(exc))
        return exc.exit_code
    return _holder_call("release", KEY_RELEASED, args, release)


def _holder_call(command: str, done_key: str, args: argparse.Namespace, call: Callable[[Any], Any]) -> int:
    """Renew and release: checked input, one call as the holder, one JSON answer."""
    from guardedcron.guard import lease as lease_ops
    from guardedcron.guard.connection import call_with_deadline, connect

    try:
        check_names(args)
        timeout = connect_timeout(args)
        dsn = checked_dsn(args)
        with connect(dsn, timeout) as conn:
            state: lease_ops.LeaseState = call_with_deadline(conn, dsn, HOLDER_CALL_SECONDS, call)
    except GuardError as exc:
        say(command, str(exc))
        return exc.exit_code
    emit(
        {
            done_key: state.ok,
            KEY_LOCK: args.lock,
            KEY_HOLDER: state.holder,
            KEY_FENCE: state.fence,
            KEY_LOCKED_UNTIL: iso(state.locked_until),
        }
    )
    if not state.ok:
        say(
            command,
            f"not the holder: {args.lock} is held by {state.holder} (fence {state.fence}); nothing changed",
        )
        return EXIT_NOT_ACQUIRED
    return EXIT_OK


def run_keep(args: argparse.Namespace) -> int:
    from guardedcron.guard.connection import connect
    from guardedcron.guard.keeper import Keeper, KeepRequest
    from guardedcron.guard.outputs import write_keeper_ready

    try:
        check_names(args)
        seconds = lease_seconds(args)
        fence = _fence_argument(args)
        if args.out is not None:
            check_out_dir("--out", args.out)
        request = KeepRequest(
            dsn=checked_dsn(args),
            lock=args.lock,
            holder=args.holder,
            fence=fence,
            lease_seconds=seconds,
            connect_timeout=connect_timeout(args),
            out_dir=args.out,
            exit_on_lost=args.on_lost == "exit",
        )
    except GuardError as exc:
        say("keep", str(exc))
        return exc.exit_code
    keeper = Keeper(request, connect, lambda message: say("keep", message), _check_in(args))
    keeper.install_signal_handlers()
    if args.out is not None:
        # Only now may the workload start (the startupProbe waits for this file): a
        # SIGTERM before the handler would end the keeper without releasing the lease.
        write_keeper_ready(args.out)
        if (args.out / LOST_FILE).exists():
            # Restarted after reporting a loss (a native sidecar is restarted even under
            # restartPolicy Never): do not fight over the lease again, wait to be stopped.
            say("keep", "the lease was lost earlier in this pod; waiting for SIGTERM")
            keeper.wait_for_stop()
            return EXIT_OK
    say("keep", f"keeping lock {args.lock} (fence {fence}), renewing every {keeper.interval:g} s")
    keeper.ping_start()
    return keeper.run()


def _check_in(args: argparse.Namespace) -> CheckIn | None:
    """The keeper's check-in, or None. A URL that is missing or cannot be pinged is one
    line and no pings, never a failed keeper: the run goes on, and the external service
    pages for the pings it misses."""
    if not args.check_in:
        return None
    from guardedcron.guard.check_in import CheckIn, CheckInRefused

    def log(message: str) -> None:
        say("keep", message)

    url = os.environ.get(ENV_CHECK_IN_URL, "").strip()
    if not url:
        log(f"{KEEPER_CHECK_IN_FLAG}: ${ENV_CHECK_IN_URL} is empty (the Secret or its key is "
            "missing?); no check-in pings")
        return None
    try:
        return CheckIn(url, log)
    except CheckInRefused as exc:
        log(f"{KEEPER_CHECK_IN_FLAG}: {exc}; no check-in pings")
        return None


def lease_seconds(args: argparse.Namespace) -> float:
    from guardedcron.guard.lease import check_lease_seconds

    seconds = parse_number("--lease-seconds", args.lease_seconds)
    check_lease_seconds("--lease-seconds", seconds)
    return seconds


def _fence_argument(args: argparse.Namespace) -> int:
    if args.fence is not None:
        return parse_fence("--fence", args.fence)
    name = shown(str(args.fence_file))
    try:
        with args.fence_file.open("rb") as file:
            # A fence is at most 20 characters: a larger file is not a fence file.
            text = file.read(64).decode("ascii").strip()
    except (OSError, ValueError) as exc:  # ValueError: NUL in the name, or not ASCII text
        reason = exc.strerror if isinstance(exc, OSError) else "not a fence"
        raise BadInput(f"cannot read --fence-file {name}: {reason}") from None
    return parse_fence(f"the fence in --fence-file {name}", text)
