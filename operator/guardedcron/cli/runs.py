"""`guardedcron runs`: a lock's run history, its gaps against the schedule, its overlaps."""

from __future__ import annotations

import argparse
import itertools
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from guardedcron.cli.guard_commands import (
    add_connection_options,
    check_name_argument,
    checked_dsn,
    connect_timeout,
    emit,
    parse_integer,
    parse_seconds,
    say,
    shown,
)
from guardedcron.contract import ADMIN_CALL_SECONDS, EXIT_FAILURE, EXIT_OK
from guardedcron.guard.errors import BadInput, GuardError

if TYPE_CHECKING:
    from guardedcron.schedule import Schedule

DEFAULT_GAP_WINDOW = timedelta(days=7)
# A run that starts later than this is late whatever the tolerance: a wider one would
# hide every gap of the default window.
MAX_TOLERANCE = DEFAULT_GAP_WINDOW
# What a gap search may expand a schedule to: a year of a job every 5 minutes. More is
# a window too wide to answer in one query; narrow --since/--until instead.
MAX_EXPECTED_RUNS = 110_000
# Times the gap search accepts: inside both Python's and PostgreSQL's ranges, with room
# for the window and tolerance arithmetic on either side.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--lock", required=True, help="the lease name")
    parser.add_argument("--limit", default="50", help="how many recent runs to list (default 50)")
    parser.add_argument(
        "--gaps", action="store_true", help="list expected fire times with no run (needs --schedule)"
    )
    parser.add_argument("--schedule", help="the cron schedule, as in the GuardedCronJob")
    parser.add_argument("--time-zone", default="UTC", help="IANA time zone of the schedule")
    parser.add_argument("--since", help="start of the gap window, ISO 8601 (default: 7 days back)")
    parser.add_argument("--until", help="end of the gap window, ISO 8601 (default: now)")
    parser.add_argument(
        "--tolerance-seconds",
        default="60",
        help="how long a slot's run may take to start: newer slots are not counted yet (default 60)",
    )
    parser.add_argument(
        "--overlaps",
        action="store_true",
        help="list runs that started while an earlier fenced run was unfinished",
    )
    parser.add_argument(
        "--mark-abandoned",
        action="store_true",
        help="first mark runs whose lease ran out while 'running' as abandoned",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_connection_options(parser)
    parser.set_defaults(run=run_runs)


def parse_time(what: str, text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(f"{what} must be an ISO 8601 time, got {shown(text)}") from None
    if value.tzinfo is None:
        raise BadInput(f"{what} needs a UTC offset, e.g. {text}+00:00")
    try:
        in_range = EARLIEST <= value <= LATEST
    except OverflowError:  # the offset moves it past year 1 or 9999
        in_range = False
    if not in_range:
        raise BadInput(f"{what} must be from {EARLIEST.date()} to {LATEST.date()}, got {shown(text)}")
    return value


def run_runs(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except GuardError as exc:
        say("runs", str(exc))
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    from guardedcron.guard import history
    from guardedcron.guard.connection import call_with_deadline, connect
    from guardedcron.guard.lease import MAX_RETAIN_RUNS

    check_name_argument("--lock", args.lock)
    limit = parse_integer("--limit", args.limit, minimum=0, maximum=MAX_RETAIN_RUNS)
    tolerance = timedelta(
        seconds=parse_seconds(
            "--tolerance-seconds",
            args.tolerance_seconds,
            minimum=0,
            maximum=MAX_TOLERANCE.total_seconds(),
        )
    )
    schedule = zone = None
    if args.gaps:
        schedule, zone = _gap_schedule(args.schedule, args.time_zone, args.lock)
    since = parse_time("--since", args.since) if args.since else None
    until = parse_time("--until", args.until) if args.until else None
    if since is not None and until is not None and since > until:
        raise BadInput(f"--since ({since.isoformat()}) is after --until ({until.isoformat()})")
    timeout = connect_timeout(args)
    dsn = checked_dsn(args)

    def read(conn: Any) -> dict[str, Any]:
        report: dict[str, Any] = {"lock": args.lock}
        # Another tenant's lock is refused (exit 77) before anything is read or written.
        history.check_grant(conn, args.lock)
        # The gap window first: it may still refuse the input, before anything is written.
        expected = None
        if schedule is not None and zone is not None:
            start, end, expected = _gap_window(conn, args.lock, schedule, zone, since, until, tolerance)
            report["gap_window"] = {
                "since": start.isoformat(),
                "until": end.isoformat(),
                "expected": len(expected),
                "schedule": schedule.text,  # H resolved: what the CronJob got
                "written_schedule": args.schedule,
                "time_zone": args.time_zone,
            }
        if args.mark_abandoned:
            report["marked_abandoned"] = history.mark_abandoned(conn, args.lock)
        runs = history.list_runs(conn, args.lock, limit)
        report["runs"] = [r.as_json() for r in runs]
        if args.overlaps:
            report["overlaps"] = [
                {"earlier": o.earlier.as_json(), "later": o.later.as_json()}
                for o in history.find_overlaps(conn, args.lock)
            ]
        if expected is not None:
            gaps = history.find_gaps(conn, args.lock, expected)
            report["gaps"] = [{"expected_at": g.expected_at.isoformat(), "slot": g.slot} for g in gaps]
        return report

    with connect(dsn, timeout) as conn:
        report = call_with_deadline(conn, dsn, ADMIN_CALL_SECONDS, read)

    if args.json:
        emit(report)
    else:
        print_report(report)
    trouble = report.get("gaps") or report.get("overlaps")
    return EXIT_FAILURE if trouble else EXIT_OK


def _gap_schedule(text: str | None, time_zone: str, lock: str) -> tuple[Schedule, tzinfo]:
    """The schedule the gaps are counted against: `text` with `H` resolved for `lock`, as
    the operator resolves it for the CronJob (the lock is the effective one the runs hold,
    so the resolution is the same), in `time_zone`."""
    if not text:
        raise BadInput("--gaps needs --schedule")
    from guardedcron.schedule import Schedule, ScheduleError, load_time_zone
    from guardedcron.schedule.hashed import resolve_hashed

    try:
        schedule = Schedule.parse(resolve_hashed(text, lock))
    except ScheduleError as exc:
        raise BadInput(f"--schedule: {exc}") from None
    try:
        zone = load_time_zone(time_zone)
    except ScheduleError as exc:
        raise BadInput(str(exc)) from None
    return schedule, zone


def _gap_window(
    conn: Any,
    lock: str,
    schedule: Schedule,
    zone: tzinfo,
    since: datetime | None,
    until: datetime | None,
    tolerance: timedelta,
) -> tuple[datetime, datetime, list[datetime]]:
    """The window to search (default: the last 7 days, no older than the oldest kept run)
    and the fire times the schedule expects in it; too many is bad input."""
    from guardedcron.guard.timestamps import reading

    row = reading(conn).execute(
        "SELECT clock_timestamp(), min(started_at) FROM guardedcron.runs WHERE lock_name = %s",
        (lock,),
    ).fetchone()
    assert row is not None
    db_now: datetime = row[0]
    oldest_kept: datetime | None = row[1]
    end = until or db_now - tolerance
    start = since or end - DEFAULT_GAP_WINDOW
    if since is None and oldest_kept is not None and oldest_kept > start + tolerance:
        # Before the oldest run retention kept, a missing run is not a gap. (Compared
        # first: an edited row's '-infinity' reads as the year 1, which has no earlier time.)
        start = oldest_kept - tolerance
    # iter_between excludes its start; the window includes it.
    fire_times = schedule.iter_between(start - timedelta(microseconds=1), end, zone)
    expected = list(itertools.islice(fire_times, MAX_EXPECTED_RUNS + 1))
    if len(expected) > MAX_EXPECTED_RUNS:
        raise BadInput(
            f"the schedule fires more than {MAX_EXPECTED_RUNS} times between {start.isoformat()} "
            f"and {end.isoformat()}; narrow the window with --since/--until"
        )
    return start, end, expected


def print_report(report: dict[str, Any]) -> None:
    print(f"{'ID':>8}  {'STARTED':25}  {'OUTCOME':9}  {'FENCE':>6}  {'SLOT':>9}  HOLDER / REASON")
    for run in report["runs"]:
        fence = "" if run["fence"] is None else run["fence"]
        slot = "manual" if run["slot"] is None else run["slot"]
        detail = run["holder"] + (f"  ({run['reason']})" if run["reason"] else "")
        print(
            f"{run['id']:>8}  {run['started_at'][:25]:25}  {run['outcome']:9}  {fence!s:>6}  "
            f"{slot!s:>9}  {detail}"
        )
    if "marked_abandoned" in report:
        print(f"\nmarked abandoned: {report['marked_abandoned']}")
    if "overlaps" in report:
        print(f"\noverlaps: {len(report['overlaps'])}")
        for o in report["overlaps"]:
            print(
                f"  run {o['later']['id']} (fence {o['later']['fence']}) started while run "
                f"{o['earlier']['id']} (fence {o['earlier']['fence']}) was unfinished"
            )
    if "gaps" in report:
        window = report["gap_window"]
        written = window["written_schedule"]
        resolved = window["schedule"]
        of = resolved if resolved == written else f"{resolved} (H resolved from {written})"
        print(
            f"\ngaps: {len(report['gaps'])} of {window['expected']} expected runs "
            f"between {window['since']} and {window['until']}\nschedule: {of} in {window['time_zone']}"
        )
        for g in report["gaps"]:
            print(f"  no run for {g['expected_at']} (slot {g['slot']})")
