"""Taking a lease: guardedcron beside the peers' patterns, on one durable PostgreSQL.

Every approach takes the lock and, once it has it, lets it go (a guard does both: acquire
before the run, release after it), two holders in turn, so every acquisition is a takeover:

- **guardedcron**: `acquire_v2` + `release_v2` (fenced) at the current schema, with a
  short history and with the lock's history at its 10,000-run cap;
- **insert-then-update** (the pattern of ShedLock's JDBC provider, rewritten here): an
  `INSERT` of the lock row, and when the row exists (duplicate key) an `UPDATE ... WHERE
  lock_until <= now()`; unlocking sets `lock_until` to now. No fence, no history;
- **advisory (session)**: `pg_try_advisory_lock(key)`, released by `pg_advisory_unlock`;
- **advisory (transaction)**: `BEGIN; SELECT pg_try_advisory_xact_lock(key)`, released by
  `COMMIT`.

Measured per approach, in repeats that rotate which goes first: one client's rate and
latency; statements sent per acquisition (counted at the client; a PL/pgSQL call is one),
the server's execution time (pg_stat_statements), shared buffers the acquire touched and
WAL bytes per acquisition (after a CHECKPOINT); 16 client processes contending for one
lock, each winner letting go at once ("churn": every call can win). Ratios are to the
insert-then-update pattern in the same run.

    .venv/bin/python -m bench.lease_acquire [--repeats 2] [--seconds 3] [--clients 16]
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.common import (
    Connection,
    Table,
    connect,
    fresh_database,
    median,
    ms,
    percentile,
    statements_since_reset,
    wal_lsn,
)
from guardedcron_devenv.postgres import ThrowawayPostgres

LOCK = "bench-lock"
ADVISORY_KEY = 4242
LEASE = 0.1  # seconds: the shortest lease acquire_v2 grants (contract.MIN_LEASE_SECONDS)
CAP = 10_000  # runs a lock's history keeps by default

SHEDLOCK_TABLE = """
CREATE TABLE IF NOT EXISTS bench_shedlock (
    name       text        PRIMARY KEY,
    lock_until timestamptz NOT NULL,
    locked_at  timestamptz NOT NULL,
    locked_by  text        NOT NULL
)
"""

Token = int  # what a won acquisition hands to its release: the fence, or 1 where there is none


# --- the approaches: acquire(conn, holder, hold_seconds) -> token or None (lost); release(...) ---
def v2_acquire(conn: Connection, holder: str, hold: float) -> Token | None:
    row = conn.execute(
        "SELECT acquired, fence FROM guardedcron.acquire_v2(%s, %s, %s, 0, NULL, 90, 10000)",
        (LOCK, holder, max(hold, LEASE)),
    ).fetchone()
    return int(row[1]) if row and row[0] else None


def v2_release(conn: Connection, holder: str, fence: Token) -> None:
    conn.execute(
        "SELECT released FROM guardedcron.release_v2(%s, %s, %s, 'finished', '')", (LOCK, holder, fence)
    )


def shedlock_acquire(conn: Connection, holder: str, hold: float) -> Token | None:
    seconds = max(hold, LEASE)
    try:
        conn.execute(
            "INSERT INTO bench_shedlock (name, lock_until, locked_at, locked_by)"
            " VALUES (%s, now() + make_interval(secs => %s), now(), %s)",
            (LOCK, seconds, holder),
        )
        return 1
    except psycopg.errors.UniqueViolation:
        cur = conn.execute(
            "UPDATE bench_shedlock SET lock_until = now() + make_interval(secs => %s), locked_at = now(),"
            " locked_by = %s WHERE name = %s AND lock_until <= now()",
            (seconds, holder, LOCK),
        )
        return 1 if cur.rowcount == 1 else None


def shedlock_release(conn: Connection, holder: str, token: Token) -> None:
    conn.execute(
        "UPDATE bench_shedlock SET lock_until = now() WHERE name = %s AND locked_by = %s", (LOCK, holder)
    )


def advisory_acquire(conn: Connection, holder: str, hold: float) -> Token | None:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_KEY,)).fetchone()
    return 1 if row and row[0] else None


def advisory_release(conn: Connection, holder: str, token: Token) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))


def xact_acquire(conn: Connection, holder: str, hold: float) -> Token | None:
    conn.execute("BEGIN")
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (ADVISORY_KEY,)).fetchone()
    if not (row and row[0]):
        conn.execute("ROLLBACK")
        return None
    return 1


def xact_release(conn: Connection, holder: str, token: Token) -> None:
    conn.execute("COMMIT")


@dataclass(frozen=True)
class Approach:
    name: str
    acquire: Callable[[Connection, str, float], Token | None]
    release: Callable[[Connection, str, Token], None]
    history_rows: int = 0  # guardedcron only: the lock's history when the measurement starts

    @property
    def guarded(self) -> bool:
        return self.acquire is v2_acquire


PEER = "insert-then-update (ShedLock JDBC pattern)"
APPROACHES = (
    Approach("guardedcron, short history", v2_acquire, v2_release),
    Approach(f"guardedcron, history at its {CAP:,}-run cap", v2_acquire, v2_release, history_rows=CAP),
    Approach(PEER, shedlock_acquire, shedlock_release),
    Approach("pg_try_advisory_lock", advisory_acquire, advisory_release),
    Approach("pg_try_advisory_xact_lock", xact_acquire, xact_release),
)


def database(server: ThrowawayPostgres, name: str) -> str:
    """A new database at the current schema, with the pattern's table."""
    dsn = fresh_database(server, name)
    with connect(dsn) as conn:
        conn.execute(SHEDLOCK_TABLE)
    return dsn


# --- one client's loop (also the body of each contending process) ---------------------
@dataclass
class Sample:
    calls: int = 0
    wins: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # of each acquire call
    release_latencies: list[float] = field(default_factory=list)


def client_loop(
    dsn: str, approach: Approach, holder: str, seconds: float, hold: float, start_at: float
) -> Sample:
    sample = Sample()
    with connect(dsn, holder) as conn:
        while time.time() < start_at:  # every process starts together
            time.sleep(0.001)
        began = time.perf_counter()
        deadline = began + seconds
        while time.perf_counter() < deadline:
            who = f"{holder}.{sample.calls % 2}"  # two holders in turn: every win is a takeover
            t0 = time.perf_counter()
            token = approach.acquire(conn, who, hold)
            sample.latencies.append(time.perf_counter() - t0)
            sample.calls += 1
            if token is not None:
                sample.wins += 1
                if hold:
                    time.sleep(hold)
                t0 = time.perf_counter()
                approach.release(conn, who, token)
                sample.release_latencies.append(time.perf_counter() - t0)
        sample.seconds = time.perf_counter() - began
    return sample


def _process_entry(args: tuple[str, Approach, str, float, float, float]) -> Sample:
    return client_loop(*args)


def contend(dsn: str, approach: Approach, clients: int, seconds: float, hold: float) -> list[Sample]:
    """`clients` spawned processes on one lock; the approach reaches them pickled, so its
    acquire and release must be module-level functions."""
    start_at = time.time() + 3.0  # time for every process to start and connect
    jobs = [(dsn, approach, f"client-{i}", seconds, hold, start_at) for i in range(clients)]
    with mp.get_context("spawn").Pool(clients) as pool:
        return pool.map(_process_entry, jobs)


def reset_lock(dsn: str, approach: Approach) -> None:
    """The same starting point for every measurement: lock rows gone, history as the approach
    says (one winning run a minute, oldest first, numbered as its generations; the lease row,
    made again by the first acquisition, counts on from them)."""
    with connect(dsn) as conn:
        conn.execute("DELETE FROM bench_shedlock")
        conn.execute("DELETE FROM guardedcron.runs WHERE lock_name = %s", (LOCK,))
        conn.execute("DELETE FROM guardedcron.leases WHERE lock_name = %s", (LOCK,))
        conn.execute(
            "INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, finished_at, outcome,"
            " generation) SELECT %(lock)s, 'old', -g, now() - make_interval(mins => g),"
            " now() - make_interval(mins => g), 'succeeded', %(rows)s + 1 - g"
            " FROM generate_series(%(rows)s, 1, -1) g",
            {"lock": LOCK, "rows": approach.history_rows},
        )
        conn.execute("VACUUM ANALYZE guardedcron.runs")


# --- statements and WAL per acquisition -------------------------------------------------
class CountingConnection:
    """Stands in for a connection and counts the statements the client sends (round trips)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.statements = 0

    def execute(self, query: Any, params: Any = None) -> Any:
        self.statements += 1  # counted before the call: a statement the server refuses was still sent
        return self.conn.execute(query, params)


@dataclass(frozen=True)
class Cost:
    """Per acquisition: statements sent, statements the server completed, their execution ms, WAL bytes."""

    sent: float
    completed: float
    server_ms: float
    wal_bytes: float
    acquire_ms: float  # guardedcron's acquire statement alone (0 for the other approaches)
    acquire_blocks: float  # shared buffers it touched (hit or read), nested statements included


def cost_per_acquisition(
    dsn: str, dbname: str, approach: Approach, acquisitions: int, meter_dsn: str | None = None
) -> Cost:
    """Single client, after a checkpoint. Statements sent include the release the next acquisition
    needs; server execution time is pg_stat_statements' (completed statements, commit excluded).
    The meter (reset, checkpoint, statistics) connects as the superuser: `meter_dsn` when the
    client logs in as a role that may not."""
    meter_dsn = meter_dsn or dsn
    reset_lock(meter_dsn, approach)
    with connect(meter_dsn, "measure") as meter, connect(dsn, "client") as raw:
        conn: Any = CountingConnection(raw)
        token = approach.acquire(conn, "warm", 0)  # the lock row exists from here on
        if token is not None:
            approach.release(conn, "warm", token)
        meter.execute("CHECKPOINT")
        meter.execute("SELECT pg_stat_statements_reset()")
        conn.statements = 0
        before = wal_lsn(meter)
        done = 0
        while done < acquisitions:
            holder = f"h{done % 2}"
            token = approach.acquire(conn, holder, 0)
            if token is not None:
                done += 1
                approach.release(conn, holder, token)
        after = wal_lsn(meter)
        counts = statements_since_reset(meter, dbname)
        blocks = acquire_blocks(meter, dbname)
    client = [v for q, v in counts.items() if "pg_current_wal_lsn" not in q and "CHECKPOINT" not in q]
    completed = sum(calls for calls, _ in client)
    server_ms = sum(total for _, total in client)
    acquire_ms = sum(total for query, (_, total) in counts.items() if "guardedcron.acquire_v" in query)
    return Cost(
        conn.statements / acquisitions,
        completed / acquisitions,
        server_ms / acquisitions,
        (after - before) / acquisitions,
        acquire_ms / acquisitions,
        blocks / acquisitions,
    )


def acquire_blocks(conn: Connection, dbname: str) -> int:
    """Shared buffers the acquire statements touched since the reset: the work, whatever the load."""
    row = conn.execute(
        "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements s"
        " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND s.toplevel"
        " AND s.query LIKE '%%guardedcron.acquire_v%%'",
        (dbname,),
    ).fetchone()
    return int(row[0]) if row else 0


def run(
    server: ThrowawayPostgres, *, seconds: float = 3.0, clients: int = 16, repeats: int = 2,
    costed: int = 1000,
) -> list[Table]:
    """Every approach on one database, in repeats that rotate the order; medians and ranges."""
    name = "lease"
    dsn = database(server, name)
    count = len(APPROACHES)
    solo: dict[int, list[Sample]] = {i: [] for i in range(count)}
    costs: dict[int, list[Cost]] = {i: [] for i in range(count)}
    churn: dict[int, list[tuple[float, float, list[float]]]] = {i: [] for i in range(count)}
    for repeat in range(repeats):
        order = list(range(count))
        order = order[repeat % count :] + order[: repeat % count]
        for offset in order:
            approach = APPROACHES[offset]
            reset_lock(dsn, approach)
            solo[offset].append(client_loop(dsn, approach, "solo", seconds, 0.0, time.time()))
            costs[offset].append(cost_per_acquisition(dsn, name, approach, costed))
            reset_lock(dsn, approach)
            samples = contend(dsn, approach, clients, seconds, 0.0)
            span = max(s.seconds for s in samples)
            churn[offset].append(
                (
                    sum(s.calls for s in samples) / span,
                    sum(s.wins for s in samples) / span,
                    [x for s in samples for x in s.latencies],
                )
            )

    def spread(values: list[float], digits: int) -> str:
        return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    peer = next(i for i, a in enumerate(APPROACHES) if a.name == PEER)
    peer_rate = median([sample.wins / sample.seconds for sample in solo[peer]])
    peer_churn = median([wins for _, wins, _ in churn[peer]])
    single = Table(
        f"Acquire and release, one client ({repeats} repeats of {seconds:g} s)",
        [
            "approach",
            "acquisitions/s",
            "ratio to the pattern",
            "acquire p50 ms",
            "acquire p99 ms",
            "statements sent per acquisition",
            "server ms per acquisition: acquire (+ release)",
            "buffers per acquire",
            "WAL bytes per acquisition",
        ],
    )
    contended = Table(
        f"{clients} client processes on one lock, churn ({repeats} repeats of {seconds:g} s)",
        ["approach", "answers/s", "acquisitions/s", "ratio to the pattern", "p50 ms", "p99 ms"],
    )
    for offset, approach in enumerate(APPROACHES):
        rates = [sample.wins / sample.seconds for sample in solo[offset]]
        latencies = [x for sample in solo[offset] for x in sample.latencies]
        acquire_part = spread([c.acquire_ms for c in costs[offset]], 3) if approach.guarded else "-"
        single.add(
            approach.name,
            spread(rates, 0),
            f"{median(rates) / peer_rate:.2f}",
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99)),
            f"{median([c.sent for c in costs[offset]]):.2f}",
            f"{acquire_part} ({spread([c.server_ms for c in costs[offset]], 3)})",
            spread([c.acquire_blocks for c in costs[offset]], 1) if approach.guarded else "-",
            spread([c.wal_bytes for c in costs[offset]], 0),
        )
        pooled = [x for _, _, lat in churn[offset] for x in lat]
        wins = [w for _, w, _ in churn[offset]]
        contended.add(
            approach.name,
            spread([answers for answers, _, _ in churn[offset]], 0),
            spread(wins, 0),
            f"{median(wins) / peer_churn:.2f}",
            ms(percentile(pooled, 0.5)),
            ms(percentile(pooled, 0.99)),
        )
    single.notes.append(
        "Every approach takes the lock and lets it go, two holders in turn (every acquisition is a"
        f" takeover, {LEASE:g} s leases for ours). At the cap, the lock's history holds {CAP:,} winning"
        " runs before the measurement, so every win pushes one out. Median of the repeats, (min-max);"
        " latency percentiles pool every repeat's calls. Statements sent: every statement the client"
        " sends per acquisition, release included (a refused INSERT counts). Server ms:"
        f" pg_stat_statements' execution time per acquisition over {costed:,} acquisitions after a"
        " CHECKPOINT, the acquire statement alone, and in brackets every statement of the approach"
        " (release included, the commit's WAL flush not). Buffers: shared buffers the acquire statement"
        " touched (hit or read, its nested statements included), which the load does not change."
    )
    contended.notes.append(
        "churn: every winner lets go at once, so every call can win; ratio: acquisitions/s to the pattern's."
    )
    return [single, contended]


def main() -> int:
    import argparse

    from bench.common import durable_server, machine_line

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--clients", type=int, default=16, help="contending processes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with durable_server() as server:
        print(machine_line(server) + "\n")
        for table in run(server, seconds=args.seconds, clients=args.clients, repeats=args.repeats):
            print(table.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
