"""`guardedcron runs`: a lock's run history, its gaps against the schedule, its overlaps."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from guardedcron.cli.guard_commands import (
    add_connection_options,
    connect_timeout,
    emit,
    parse_number,
    say,
)
from guardedcron.contract import EXIT_FAILURE, EXIT_OK
from guardedcron.guard.errors import BadInput, GuardError

DEFAULT_GAP_WINDOW = timedelta(days=7)


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
        "--tolerance-seconds", default="60", help="how late a run may start and still count (default 60)"
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
        raise BadInput(f"{what} must be an ISO 8601 time, got {text!r}") from None
    if value.tzinfo is None:
        raise BadInput(f"{what} needs a UTC offset, e.g. {text}+00:00")
    return value


def run_runs(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except GuardError as exc:
        say("runs", str(exc))
        return exc.exit_code


def _run(args: argparse.Namespace) -> int:
    from guardedcron.guard import history
    from guardedcron.guard.connection import connect, raise_for_database, resolve_dsn
    from guardedcron.guard.lease import check_name

    check_name("lock", args.lock)
    limit = int(parse_number("--limit", args.limit, integer=True))
    tolerance = timedelta(seconds=parse_number("--tolerance-seconds", args.tolerance_seconds))
    schedule = zone = None
    if args.gaps:
        if not args.schedule:
            raise BadInput("--gaps needs --schedule")
        from guardedcron.schedule import Schedule, ScheduleError, load_time_zone

        try:
            schedule = Schedule.parse(args.schedule)
            zone = load_time_zone(args.time_zone)
        except ScheduleError as exc:
            raise BadInput(str(exc)) from None
    since = parse_time("--since", args.since) if args.since else None
    until = parse_time("--until", args.until) if args.until else None

    dsn = resolve_dsn(args.dsn)
    report: dict[str, Any] = {"lock": args.lock}
    with connect(dsn, connect_timeout(args)) as conn:
        try:
            if args.mark_abandoned:
                report["marked_abandoned"] = history.mark_abandoned(conn, args.lock)
            runs = history.list_runs(conn, args.lock, limit)
            report["runs"] = [r.as_json() for r in runs]
            if args.overlaps:
                report["overlaps"] = [
                    {"earlier": o.earlier.as_json(), "later": o.later.as_json()}
                    for o in history.find_overlaps(conn, args.lock)
                ]
            if schedule is not None and zone is not None:
                row = conn.execute(
                    "SELECT clock_timestamp(), min(started_at) FROM guardedcron.runs WHERE lock_name = %s",
                    (args.lock,),
                ).fetchone()
                assert row is not None
                db_now: datetime = row[0]
                oldest_kept: datetime | None = row[1]
                end = until or db_now - tolerance
                start = since or end - DEFAULT_GAP_WINDOW
                if since is None and oldest_kept is not None:
                    # Before the oldest run retention kept, a missing run is not a gap.
                    start = max(start, oldest_kept - tolerance)
                # iter_between excludes its start; the window includes it.
                expected = list(schedule.iter_between(start - timedelta(microseconds=1), end, zone))
                gaps = history.find_gaps(conn, args.lock, expected, tolerance)
                report["gaps"] = [{"expected_at": g.expected_at.isoformat(), "slot": g.slot} for g in gaps]
                report["gap_window"] = {
                    "since": start.isoformat(),
                    "until": end.isoformat(),
                    "expected": len(expected),
                }
        except Exception as exc:
            raise_for_database(exc, dsn)
            raise

    if args.json:
        emit(report)
    else:
        print_report(report)
    trouble = report.get("gaps") or report.get("overlaps")
    return EXIT_FAILURE if trouble else EXIT_OK


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
        print(
            f"\ngaps: {len(report['gaps'])} of {window['expected']} expected runs "
            f"between {window['since']} and {window['until']}"
        )
        for g in report["gaps"]:
            print(f"  no run for {g['expected_at']} (slot {g['slot']})")
