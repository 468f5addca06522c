"""`kubectl gcj status NAME [-n NS] [--no-database] [-o json]`: one GuardedCronJob on one
screen.

From the API server: the schedule and time zone, whether it is suspended, the next slot
(status.nextScheduleTime), the conditions and the last runs (status.recentRuns). From the
database, best effort: the lease of its lock (holder, fence, locked until, whether released),
read with the DSN in the Secret spec.lease.databaseSecretRef names. When the Secret or
the database cannot be had within a few seconds, everything else is printed with one
line saying why (never the DSN or its password) and the exit is still 0.

A role made by `guardedcron db grant` may read the lock's runs but not the lease table:
then the lease is told from the lock's newest run (no locked-until time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import sys
from datetime import datetime
from typing import Any

from guardedcron.cli.cluster_options import add_cluster_options, reported_name_problems
from guardedcron.cli.gcj_common import (
    PROG,
    RUN_COLUMNS,
    PluginFailed,
    cluster,
    get_guarded_cronjob,
    run_cells,
    runs_of,
    table_lines,
)
from guardedcron.contract import EXIT_OK, EXIT_USAGE
from guardedcron.guard import redaction
from guardedcron.guard.errors import GuardError
from guardedcron.guard.history import Run
from guardedcron.kube import SECRETS, ApiError, KubeClient, NotFound
from guardedcron.spec import SecretKeyRef, SpecError, parse_guarded_cronjob

RECENT_RUNS = 5
CONDITION_COLUMNS = ("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE")
# Short: status is read by a person waiting (libpq waits at least 2 s for a connection).
CONNECT_TIMEOUT_S = 3.0
QUERY_SECONDS = 5.0
LEASE_QUERY = ("SELECT holder, fence, locked_until, released_at, clock_timestamp() "
               "FROM guardedcron.leases WHERE lock_name = %s")
FROM_LEASES = "guardedcron.leases"
FROM_RUNS = "guardedcron.runs (this role may not read guardedcron.leases)"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "status", help="one GuardedCronJob: schedule, conditions, runs and its lease",
        description="One GuardedCronJob on one screen: schedule, suspension, next slot, "
                    "conditions, recent runs, and the lease in the database (read with the "
                    "DSN its spec.lease.databaseSecretRef names; best effort).")
    parser.add_argument("name", metavar="NAME", help="the GuardedCronJob")
    add_cluster_options(parser)
    parser.add_argument("--no-database", action="store_true",
                        help="do not read the Secret or the database")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if reported_name_problems(f"{PROG} status", args.name, args.namespace):
        return EXIT_USAGE
    try:
        view = asyncio.run(gather(args.name, args.namespace, args.kubeconfig, args.context,
                                  with_database=not args.no_database))
    except PluginFailed as error:
        print(f"{PROG} status: {error}", file=sys.stderr)
        return error.code
    if args.output == "json":
        print(json.dumps(view, indent=2))
    else:
        print("\n".join(status_lines(view)))
    return EXIT_OK


async def gather(name: str, namespace: str | None, kubeconfig: str | None, context: str | None,
                 *, with_database: bool) -> dict[str, Any]:
    async with cluster(kubeconfig, context, namespace) as (client, chosen):
        gcj = await get_guarded_cronjob(client, chosen, name)
        lock, secret_ref, spec_problem = lease_reference(gcj)
        lease: dict[str, Any] | None = None
        if not with_database:
            note: str | None = "database not read (--no-database)"
        elif secret_ref is None or lock is None:
            note = f"database not read: the spec is invalid ({spec_problem})"
        else:
            lease, note = await database_lease(client, chosen, secret_ref, lock)
    return status_view(gcj, lock=lock, lease=lease, database_note=note)


def lease_reference(gcj: dict[str, Any]) -> tuple[str | None, SecretKeyRef | None, str | None]:
    """The lock's name and the DSN's Secret key, or the spec's problem."""
    try:
        lease = parse_guarded_cronjob(gcj).spec.lease
    except SpecError as error:
        return None, None, str(error)
    return lease.name, lease.database_secret_ref, None


async def database_lease(client: KubeClient, namespace: str, ref: SecretKeyRef,
                         lock: str) -> tuple[dict[str, Any] | None, str | None]:
    """The lease as the database has it, or None and why not (one line, no secret)."""
    where = f"Secret {namespace}/{ref.name}"
    try:
        secret = await client.get(SECRETS, namespace, ref.name)
    except NotFound:
        return None, f"database not read: {where} not found"
    except ApiError as error:
        return None, f"database not read: {where} cannot be read ({error.code} {error.reason})"
    encoded = (secret.get("data") or {}).get(ref.key)
    try:
        dsn = base64.b64decode(encoded, validate=True).decode() if encoded else ""
    except (binascii.Error, UnicodeDecodeError):
        dsn = ""
    if not dsn.strip():
        return None, f"database not read: {where} has no usable key {ref.key!r}"
    redaction.hide([dsn])
    try:
        return await asyncio.to_thread(read_lease, dsn, lock), None
    except GuardError as error:
        return None, f"database not read: {redaction.redact(str(error))}"


def read_lease(dsn: str, lock: str) -> dict[str, Any]:
    import psycopg

    from guardedcron.guard.connection import call_with_deadline, connect, last_line, scrub
    from guardedcron.guard.history import list_runs
    from guardedcron.guard.timestamps import reading

    def query(conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, Any]:
        try:
            row = reading(conn).execute(LEASE_QUERY, (lock,)).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return lease_from_run(lock, next(iter(list_runs(conn, lock, 1)), None))
        return lease_from_row(lock, row)

    with connect(dsn, CONNECT_TIMEOUT_S) as conn:
        try:
            return call_with_deadline(conn, dsn, QUERY_SECONDS, query)
        except psycopg.Error as error:  # any other refusal: one line, as the guard's errors are
            raise GuardError(f"the database refused: {scrub(last_line(str(error)), dsn)}") from None


# --- pure: what is shown, from the objects and rows read

def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def lease_from_row(lock: str, row: tuple[Any, ...] | None) -> dict[str, Any]:
    """The lease from its guardedcron.leases row (holder, fence, locked_until,
    released_at, the database's now); no row: never taken."""
    if row is None or not row[0]:
        return {"lock": lock, "taken": False, "held": False, "source": FROM_LEASES}
    holder, fence, locked_until, released_at, now = row
    return {"lock": lock, "taken": True, "held": released_at is None and locked_until > now,
            "holder": holder, "fence": fence, "lockedUntil": _iso(locked_until),
            "releasedAt": _iso(released_at), "source": FROM_LEASES}


def lease_from_run(lock: str, newest: Run | None) -> dict[str, Any]:
    """The lease told from the lock's newest run, for a role that may read only runs."""
    if newest is None:
        return {"lock": lock, "taken": False, "held": False, "source": FROM_RUNS}
    return {"lock": lock, "taken": True, "held": newest.finished_at is None and newest.outcome == "running",
            "holder": newest.holder, "fence": newest.fence, "lockedUntil": None,
            "releasedAt": _iso(newest.finished_at), "source": FROM_RUNS}


def status_view(gcj: dict[str, Any], *, lock: str | None, lease: dict[str, Any] | None,
                database_note: str | None) -> dict[str, Any]:
    """The facts `status` prints, as its -o json gives them."""
    metadata, spec = gcj.get("metadata") or {}, gcj.get("spec") or {}
    status = gcj.get("status") or {}
    conditions = [{key: condition.get(key) for key in
                   ("type", "status", "reason", "message", "lastTransitionTime")}
                  for condition in status.get("conditions") or () if isinstance(condition, dict)]
    runs = [{k: v for k, v in row.items() if k not in ("namespace", "guardedCronJob")}
            for row in runs_of(gcj)[:RECENT_RUNS]]
    return {"namespace": metadata.get("namespace"), "name": metadata.get("name"),
            "schedule": spec.get("schedule"), "timeZone": spec.get("timeZone"),
            "suspended": bool(spec.get("suspend")), "nextScheduleTime": status.get("nextScheduleTime"),
            "conditions": conditions, "recentRuns": runs, "lock": lock, "lease": lease,
            "databaseNote": database_note}


def lease_line(lease: dict[str, Any]) -> str:
    if not lease["taken"]:
        return "never taken"
    who = f"{lease['holder']!r}, fence {lease['fence']}"
    if lease["held"]:
        until = f", locked until {lease['lockedUntil']}" if lease["lockedUntil"] else ""
        return f"held by {who}{until}"
    if lease["releasedAt"]:
        return f"released at {lease['releasedAt']} by {who}"
    return f"ran out at {lease['lockedUntil']} (last held by {who})"


def status_lines(view: dict[str, Any]) -> list[str]:
    """`status`'s screen, kubectl describe's way: `Field:  value`, then tables."""
    zone = view["timeZone"] or "UTC, the operator's default"
    fields = [("Name", view["name"]), ("Namespace", view["namespace"]),
              ("Schedule", f"{view['schedule']}  ({zone})"),
              ("Suspended", "yes" if view["suspended"] else "no"),
              ("Next slot", view["nextScheduleTime"] or "-"), ("Lock", view["lock"] or "-")]
    if view["lease"] is not None:
        fields.append(("Lease", f"{lease_line(view['lease'])}  (from {view['lease']['source']})"))
    if view["databaseNote"]:
        fields.append(("Database", view["databaseNote"]))
    lines = [f"{label + ':':<12}{value}" for label, value in fields]
    lines.append("Conditions:")
    if view["conditions"]:
        rows = [(str(c["type"] or ""), str(c["status"] or ""), str(c["reason"] or ""),
                 str(c["lastTransitionTime"] or ""), " ".join(str(c["message"] or "").split()))
                for c in view["conditions"]]
        lines += ["  " + line for line in table_lines(CONDITION_COLUMNS, rows)]
    else:
        lines.append("  none yet (is the operator running?)")
    lines.append("Recent runs:")
    if view["recentRuns"]:
        run_rows = [run_cells(run) for run in view["recentRuns"]]
        lines += ["  " + line for line in table_lines(RUN_COLUMNS, run_rows)]
    else:
        lines.append("  none")
    return lines
