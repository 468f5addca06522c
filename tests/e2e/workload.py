"""The e2e suite's workload: what a guarded job's own container does, as a real process.

    python tests/e2e/workload.py --run-dir /var/run/guardedcron --job JOB [--items 3]
                                 [--gate] [--ignore-sigterm]
    python tests/e2e/workload.py --setup      # create the tables below (kind.sh)

The process-kubelet runs it as the workload container's image; the database comes from
`$WORKLOAD_DSN` (the same Secret the guard reads). It reads the lease the guard handed
over (`lease.json` in the run folder) and writes one row per item into `e2e_work`,
each in its own transaction that first calls `guardedcron.check_fence`. The row's
dedupe key is `<slot>:<item>` for a scheduled run and `<job>:<item>` for a manual one,
so a slot handled twice — by two clusters, or by a run and its retry — shows up as two
rows with one key. There is no unique constraint on purpose: it would hide that.

`--gate` stalls after the first item until the test inserts a row for this Job into
`e2e_gates` (how the suite keeps a run alive past its lease and then lets it write
again). `--ignore-sigterm` keeps going after SIGTERM, as a job stuck in a long call
would, so it can outlive its pod's deadline within the grace period.

Exit codes: 0 all items written; 3 a fenced write was refused (recorded in
`e2e_rejections`, and the reason written as the termination message); 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from guardedcron.contract import TERMINATION_LOG
from guardedcron.guard.errors import StaleFenceError
from guardedcron.guard.fence import HeldLease, check_fence, read_lease

EXIT_REFUSED = 3
GATE_POLL_SECONDS = 0.2
GATE_TIMEOUT_SECONDS = 120.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS e2e_work (
    id         bigserial PRIMARY KEY,
    lock       text NOT NULL,
    dedupe_key text NOT NULL,
    item       integer NOT NULL,
    holder     text NOT NULL,
    fence      bigint NOT NULL,
    job        text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS e2e_rejections (
    lock   text NOT NULL,
    holder text NOT NULL,
    fence  bigint NOT NULL,
    job    text NOT NULL,
    item   integer NOT NULL,
    reason text NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS e2e_gates (job text PRIMARY KEY);
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workload")
    parser.add_argument("--setup", action="store_true",
                        help="create the e2e tables (if missing) and exit")
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--job", help="this run's Job name (downward API)")
    parser.add_argument("--items", type=int, default=3)
    parser.add_argument("--gate", action="store_true",
                        help="after the first item, wait for a row in e2e_gates")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args(argv)
    if not args.setup and (args.run_dir is None or args.job is None):
        parser.error("--run-dir and --job are required")
    return args


def say(message: str) -> None:
    print(f"workload: {message}", flush=True)


def terminate_with(message: str) -> None:
    # The process-kubelet points the guard's variable at the container's message file.
    path = Path(os.environ.get("GUARDEDCRON_TERMINATION_LOG", TERMINATION_LOG))
    with contextlib.suppress(OSError):
        path.write_text(message[:4096])


def dedupe_key_for(slot: int | None, job: str | None, item: int) -> str:
    """`<slot>:<item>` for a scheduled run, `<job>:<item>` for a manual one."""
    return f"{slot if slot is not None else job}:{item}"


def write_item(conn: psycopg.Connection[Any], lease: HeldLease, args: argparse.Namespace,
               item: int) -> None:
    with conn.transaction():
        check_fence(conn, lease.lock, lease.fence)
        conn.execute(
            "INSERT INTO e2e_work (lock, dedupe_key, item, holder, fence, job)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (lease.lock, dedupe_key_for(lease.slot, args.job, item), item, lease.holder, lease.fence,
             args.job),
        )


def wait_for_gate(conn: psycopg.Connection[Any], job: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if conn.execute("SELECT 1 FROM e2e_gates WHERE job = %s", (job,)).fetchone():
            return
        time.sleep(GATE_POLL_SECONDS)
    raise TimeoutError(f"the gate for {job} did not open within {GATE_TIMEOUT_SECONDS:.0f} s")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.setup:
        with psycopg.connect(os.environ["WORKLOAD_DSN"], autocommit=True) as conn:
            conn.execute(SCHEMA)
        return 0
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: say("SIGTERM received; carrying on"))
    lease = read_lease(args.run_dir)
    say(f"holding {lease.lock} as {lease.holder} with fence {lease.fence}, slot {lease.slot}")
    with psycopg.connect(os.environ["WORKLOAD_DSN"], autocommit=True, connect_timeout=5) as conn:
        for item in range(1, args.items + 1):
            try:
                write_item(conn, lease, args, item)
            except StaleFenceError as exc:
                reason = str(exc)
                conn.execute(
                    "INSERT INTO e2e_rejections (lock, holder, fence, job, item, reason)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (lease.lock, lease.holder, lease.fence, args.job, item, reason),
                )
                say(f"item {item} refused: {reason}")
                terminate_with(json.dumps({"outcome": "refused", "fence": lease.fence,
                                           "item": item, "reason": reason}))
                return EXIT_REFUSED
            say(f"item {item} written")
            if args.gate and item == 1:
                say("stalling until the test opens the gate")
                wait_for_gate(conn, args.job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
