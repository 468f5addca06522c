"""What recording history costs a lease, apart from what our checks cost (issue 13).

On one durable server and one database, in alternating rounds:

- **ours**: `acquire_v2` + `release_v2` as shipped (the current schema).
- **history only**: a bench-only pair of functions, `bench_floor.acquire` and
  `bench_floor.release`, on the same tables. They keep what a lease with history and a
  fence must do: answer a held lease from an unlocked read, else read the lease row under
  a row lock, draw a fence from the sequence, insert the run and point the lease at it;
  on release end both in one statement; a loss writes ours' `skipped` row
  (`guardedcron._record_skip`), or, in the second kind, nothing. They drop everything else
  ours does: the grant check, the argument checks, the lock timeout, slot claims, the
  retried-call answer, the fence's guards against a sequence set back or used up, the
  abandoned run's record, retention, and the plan settings. **Not a candidate schema**:
  it only shows how far the cost of the checks stands from the cost of the history.
- **insert-then-update** (ShedLock's JDBC pattern, as in `bench/lease_acquire.py`).

One client (every call wins): cycles a second (median of the rounds, min-max) and, over a
separate stretch after a checkpoint, the WAL per cycle by record type (`pg_waldump
--stats`). Churn: 16 client processes on one lock, every winner letting go at once
(answers and acquisitions a second).

    nice -n 5 .venv/bin/python -m bench.acquisition_floor [--rounds 6] [--cycles 2000]
                                                        [--clients 16] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time

from bench import lease_acquire
from bench.common import Connection, Table, connect, durable_server, fresh_database, machine_line, wal_lsn
from bench.lease_acquire import Approach
from guardedcron_devenv.postgres import SERVER_USER, ThrowawayPostgres

FLOOR_LOCK = "bench-floor-lock"

FLOOR_SQL = """
CREATE SCHEMA IF NOT EXISTS bench_floor;
CREATE OR REPLACE FUNCTION bench_floor.acquire(
    p_lock text, p_holder text, p_lease_seconds double precision, p_record_loss boolean
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t timestamptz := clock_timestamp();
    new_fence bigint;
BEGIN
    -- A held lease is answered without a row lock, as ours does, so losers do not queue.
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    IF cur.locked_until <= t THEN
        SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
        t := clock_timestamp();
        IF cur.locked_until <= t THEN
            new_fence := nextval('guardedcron.fences');
            WITH won AS (
                INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, outcome, generation)
                VALUES (p_lock, p_holder, new_fence, t, 'running', cur.generation + 1) RETURNING id
            )
            UPDATE guardedcron.leases l
               SET holder = p_holder, fence = new_fence, acquired_at = t,
                   locked_until = t + make_interval(secs => p_lease_seconds), min_hold_until = t,
                   run_id = (SELECT won.id FROM won), released_at = NULL, generation = cur.generation + 1
             WHERE l.lock_name = p_lock;
            RETURN new_fence;
        END IF;
    END IF;
    IF p_record_loss THEN  -- ours' own loss record: a skipped run, committed without a flush
        PERFORM guardedcron._record_skip(p_lock, p_holder, NULL, 'lease held', t);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION bench_floor.release(p_lock text, p_holder text, p_fence bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    WITH ended AS (
        UPDATE guardedcron.leases l SET locked_until = t, released_at = t
         WHERE l.lock_name = p_lock AND l.holder = p_holder AND l.fence = p_fence
        RETURNING l.run_id
    )
    UPDATE guardedcron.runs r SET outcome = 'succeeded', finished_at = t
     WHERE r.id = (SELECT ended.run_id FROM ended) AND r.lock_name = p_lock AND r.outcome = 'running';
    RETURN FOUND;
END $$;
"""


def floor_acquire(conn: Connection, holder: str, hold: float, record_loss: bool = True) -> int | None:
    row = conn.execute(
        "SELECT bench_floor.acquire(%s, %s, %s, %s)", (FLOOR_LOCK, holder, lease_acquire.LEASE, record_loss)
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def floor_acquire_unrecorded(conn: Connection, holder: str, hold: float) -> int | None:
    return floor_acquire(conn, holder, hold, record_loss=False)


def floor_release(conn: Connection, holder: str, fence: int) -> None:
    conn.execute("SELECT bench_floor.release(%s, %s, %s)", (FLOOR_LOCK, holder, fence))


OURS = "ours: acquire_v2 + release_v2"
FLOOR = "history only (bench_floor, not a schema)"
FLOOR_UNRECORDED = "history only, losses not recorded (bench_floor)"
PATTERN = "insert-then-update (ShedLock JDBC pattern)"
APPROACHES = {
    approach.name: approach
    for approach in (
        Approach(OURS, lease_acquire.v2_acquire, lease_acquire.v2_release, "release_v2"),
        Approach(FLOOR, floor_acquire, floor_release, "bench_floor.release"),
        Approach(FLOOR_UNRECORDED, floor_acquire_unrecorded, floor_release, "bench_floor.release"),
        Approach(PATTERN, lease_acquire.shedlock_acquire, lease_acquire.shedlock_release, "UPDATE"),
    )
}
# One client never loses, so there the floor's two kinds are the same calls.
SOLO = (OURS, FLOOR, PATTERN)


def prepare(dsn: str) -> None:
    lease_acquire.prepare(dsn)
    with connect(dsn) as conn:
        conn.execute(FLOOR_SQL)
        # The floor's lease row exists from the start; it never makes one.
        conn.execute(
            "INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until,"
            " min_hold_until, generation) VALUES (%s, '', 0, now(), now(), now(), 0)",
            (FLOOR_LOCK,),
        )


def cycles(conn: Connection, approach: Approach, count: int) -> float:
    """Seconds for `count` wins, each let go; two holders in turn, so every win is a takeover."""
    began = time.perf_counter()
    for i in range(count):
        holder = f"h{i % 2}"
        token = approach.acquire(conn, holder, 0)
        if token is None:
            raise RuntimeError(f"a single client lost a call ({holder}): the benchmark's premise is broken")
        approach.release(conn, holder, token)
    return time.perf_counter() - began


def wal_by_record(server: ThrowawayPostgres, start: int, end: int) -> dict[str, tuple[int, int]]:
    """Per record type between two LSNs: (bytes in all, of them full-page images)."""

    def lsn(value: int) -> str:
        return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"

    run_as = ["runuser", "-u", SERVER_USER, "--"] if os.geteuid() == 0 else []
    out = subprocess.run(
        [
            *run_as,
            str(server.bin / "pg_waldump"),
            "-p",
            str(server.data / "pg_wal"),
            "-s",
            lsn(start),
            "-e",
            lsn(end),
            "--stats=record",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        # "Heap/HOT_UPDATE   1500 ( 21.23)   163497 ( 28.76)   0 ( 0.00)   163497 ( 26.32)"
        match = re.match(r"(\S+/\S+)\s+(\d+) \(.*\)\s+\d+ \(.*\)\s+(\d+) \(.*\)\s+(\d+) \(", line)
        if match and int(match.group(2)):
            found[match.group(1)] = (int(match.group(4)), int(match.group(3)))
    return found


def churn(dsn: str, name: str, clients: int, seconds: float) -> tuple[float, float]:
    """(answers/s, acquisitions/s) of `clients` processes on one lock, every winner letting go at once."""
    samples = lease_acquire.contend(dsn, APPROACHES[name], clients, seconds, 0.0)
    span = max(sample.seconds for sample in samples)
    return sum(s.calls for s in samples) / span, sum(s.wins for s in samples) / span


def wal_per_cycle(
    server: ThrowawayPostgres, meter: Connection, conn: Connection, name: str
) -> dict[str, tuple[int, int]]:
    meter.execute("CHECKPOINT")
    start = wal_lsn(meter)
    cycles(conn, APPROACHES[name], 500)
    end = wal_lsn(meter)
    meter.execute("SELECT pg_switch_wal()")  # the stretch is complete on disk for pg_waldump
    return {
        kind: (size // 500, images // 500)
        for kind, (size, images) in wal_by_record(server, start, end).items()
    }


def run(rounds: int, count: int, clients: int, seconds: float) -> list[Table]:
    with durable_server() as server:
        machine = machine_line(server)  # its load average is the one at the start
        dsn = fresh_database(server, "floor")
        prepare(dsn)
        rates: dict[str, list[float]] = {name: [] for name in SOLO}
        with connect(dsn, "meter") as meter, connect(dsn, "client") as conn:
            for name in SOLO:  # warm: lock rows, plans, the fence sequence's cache
                cycles(conn, APPROACHES[name], 200)
            for round_index in range(rounds):
                for name in SOLO if round_index % 2 == 0 else SOLO[::-1]:
                    rates[name].append(count / cycles(conn, APPROACHES[name], count))
            wal = {name: wal_per_cycle(server, meter, conn, name) for name in SOLO}
        contended: dict[str, list[tuple[float, float]]] = {name: [] for name in APPROACHES}
        order = list(APPROACHES)
        for round_index in range(2):
            for name in order if round_index % 2 == 0 else order[::-1]:
                contended[name].append(churn(dsn, name, clients, seconds))

    pattern = statistics.median(rates[PATTERN])
    speed = Table(
        f"One client, {rounds} rounds of {count} cycles (acquire + release), approaches in turn",
        ["approach", "cycles/s", "ratio to the pattern", "WAL bytes per cycle"],
        notes=[machine],
    )
    for name in SOLO:
        median = statistics.median(rates[name])
        speed.add(
            name,
            f"{median:.0f} ({min(rates[name]):.0f}-{max(rates[name]):.0f})",
            f"{median / pattern:.2f}",
            sum(size for size, _ in wal[name].values()),
        )
    ours = wal[OURS]
    kinds = sorted({kind for found in wal.values() for kind in found}, key=lambda k: -ours.get(k, (0, 0))[0])
    records = Table(
        "WAL per cycle by record type: bytes (of them full-page images), 500 cycles after a checkpoint",
        ["record", *SOLO],
    )
    for kind in kinds:
        records.add(kind, *("{} ({})".format(*wal[name].get(kind, (0, 0))) for name in SOLO))
    pattern_wins = statistics.median(w for _, w in contended[PATTERN])
    crowd = Table(
        f"{clients} client processes on one lock, churn (each winner lets go at once),"
        f" 2 rounds of {seconds:g} s",
        ["approach", "answers/s", "acquisitions/s", "ratio to the pattern"],
    )
    for name in APPROACHES:
        answers = [a for a, _ in contended[name]]
        wins = [w for _, w in contended[name]]
        crowd.add(
            name,
            f"{statistics.median(answers):.0f} ({min(answers):.0f}-{max(answers):.0f})",
            f"{statistics.median(wins):.0f} ({min(wins):.0f}-{max(wins):.0f})",
            f"{statistics.median(wins) / pattern_wins:.2f}",
        )
    return [speed, records, crowd]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16, help="processes on one lock in churn")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each churn round")
    args = parser.parse_args()
    for table in run(args.rounds, args.cycles, args.clients, args.seconds):
        print(table.markdown())


if __name__ == "__main__":
    main()
