"""Taking a lease: guardedcron's acquire_v1 against the peers' patterns, side by side.

- **guardedcron**: `SELECT * FROM guardedcron.acquire_v1(...)`, one statement: lease,
  fence, history row and retention in one short transaction.
- **insert-then-update** (the pattern of ShedLock's JDBC provider, rewritten here): an
  `INSERT` of the lock row, and when the row exists (duplicate key) an `UPDATE ... WHERE
  lock_until <= now()`; two statements once the row exists, no fence, no history.
- **advisory (session)**: `pg_try_advisory_lock(key)`, released by `pg_advisory_unlock`.
- **advisory (transaction)**: `BEGIN; SELECT pg_try_advisory_xact_lock(key)`, released by
  `COMMIT`.

Measured per approach: single-client rate and latency; 16 client processes contending
for one lock, either with the lock free again at once ("churn": every caller can win) or
held for 100 ms by each winner ("held": most callers lose); statements sent per acquisition
(counted at the client: round trips; a PL/pgSQL function call is one);
WAL bytes per acquisition (`pg_current_wal_lsn()` difference over a run, after a checkpoint).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.common import Connection, Table, connect, ms, percentile, statements_since_reset, wal_lsn

LOCK = "bench-lock"
ADVISORY_KEY = 4242
TINY_LEASE = 0.000001  # seconds: expired by the next call, so every call is a real takeover

SHEDLOCK_TABLE = """
CREATE TABLE IF NOT EXISTS bench_shedlock (
    name       text        PRIMARY KEY,
    lock_until timestamptz NOT NULL,
    locked_at  timestamptz NOT NULL,
    locked_by  text        NOT NULL
)
"""


# --- the approaches: acquire(conn, holder, hold_seconds) -> won?, release(conn) after a win ---
def ours_acquire(conn: Connection, holder: str, hold: float) -> bool:
    row = conn.execute(
        "SELECT acquired FROM guardedcron.acquire_v1(%s, %s, %s, 0, NULL, 90, 10000)",
        (LOCK, holder, hold or TINY_LEASE),
    ).fetchone()
    return bool(row and row[0])


def shedlock_acquire(conn: Connection, holder: str, hold: float) -> bool:
    seconds = hold or TINY_LEASE
    try:
        conn.execute(
            "INSERT INTO bench_shedlock (name, lock_until, locked_at, locked_by)"
            " VALUES (%s, now() + make_interval(secs => %s), now(), %s)",
            (LOCK, seconds, holder),
        )
        return True
    except psycopg.errors.UniqueViolation:
        cur = conn.execute(
            "UPDATE bench_shedlock SET lock_until = now() + make_interval(secs => %s), locked_at = now(),"
            " locked_by = %s WHERE name = %s AND lock_until <= now()",
            (seconds, holder, LOCK),
        )
        return cur.rowcount == 1


def advisory_acquire(conn: Connection, holder: str, hold: float) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_KEY,)).fetchone()
    return bool(row and row[0])


def advisory_release(conn: Connection) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))


def xact_acquire(conn: Connection, holder: str, hold: float) -> bool:
    conn.execute("BEGIN")
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (ADVISORY_KEY,)).fetchone()
    if not (row and row[0]):
        conn.execute("ROLLBACK")
        return False
    return True


def xact_release(conn: Connection) -> None:
    conn.execute("COMMIT")


def no_release(conn: Connection) -> None:
    """A lease ends by itself; nothing to send."""


@dataclass(frozen=True)
class Approach:
    name: str
    acquire: Callable[[Connection, str, float], bool]
    release: Callable[[Connection], None]
    release_note: str
    history_rows: int = 0  # guardedcron only: the lock's history when the measurement starts


APPROACHES = (
    Approach("guardedcron acquire_v1 (short history)", ours_acquire, no_release, "none (the lease runs out)"),
    Approach(
        "guardedcron acquire_v1 (history at its 10,000-row cap)",
        ours_acquire,
        no_release,
        "none (the lease runs out)",
        history_rows=10_000,
    ),
    Approach("insert-then-update (ShedLock JDBC pattern)", shedlock_acquire, no_release, "none (lock_until)"),
    Approach("pg_try_advisory_lock", advisory_acquire, advisory_release, "pg_advisory_unlock"),
    Approach("pg_try_advisory_xact_lock", xact_acquire, xact_release, "COMMIT"),
)


def prepare(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(SHEDLOCK_TABLE)


# --- one client's loop (also the body of each contending process) ---------------------
@dataclass
class Sample:
    calls: int = 0
    wins: int = 0
    seconds: float = 0.0
    latencies: list[float] | None = None


def client_loop(
    dsn: str, approach_index: int, holder: str, seconds: float, hold: float, start_at: float
) -> Sample:
    approach = APPROACHES[approach_index]
    sample = Sample(latencies=[])
    with connect(dsn, holder) as conn:
        while time.time() < start_at:  # every process starts together
            time.sleep(0.001)
        began = time.perf_counter()
        deadline = began + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            won = approach.acquire(conn, holder, hold)
            sample.latencies.append(time.perf_counter() - t0)
            sample.calls += 1
            if won:
                sample.wins += 1
                if hold:
                    time.sleep(hold)
                approach.release(conn)
        sample.seconds = time.perf_counter() - began
    return sample


def _process_entry(args: tuple[str, int, str, float, float, float]) -> Sample:
    return client_loop(*args)


def contend(dsn: str, approach_index: int, clients: int, seconds: float, hold: float) -> list[Sample]:
    start_at = time.time() + 3.0  # time for every process to start and connect
    jobs = [(dsn, approach_index, f"client-{i}", seconds, hold, start_at) for i in range(clients)]
    with mp.get_context("spawn").Pool(clients) as pool:
        return pool.map(_process_entry, jobs)


def reset_lock(dsn: str, approach: Approach) -> None:
    """The same starting point for every measurement: lock rows gone, history as the approach says."""
    with connect(dsn) as conn:
        conn.execute("DELETE FROM bench_shedlock")
        conn.execute("DELETE FROM guardedcron.runs WHERE lock_name = %s", (LOCK,))
        conn.execute(
            "INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, finished_at, outcome)"
            " SELECT %s, 'old', -g, now() - make_interval(mins => g), now() - make_interval(mins => g),"
            " 'succeeded' FROM generate_series(1, %s) g",
            (LOCK, approach.history_rows),
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


def cost_per_acquisition(dsn: str, dbname: str, approach: Approach, acquisitions: int) -> Cost:
    """Single client, after a checkpoint. Statements sent include the release the next acquisition
    needs; server execution time is pg_stat_statements' (completed statements, commit excluded)."""
    reset_lock(dsn, approach)
    with connect(dsn, "measure") as meter, connect(dsn, "client") as raw:
        conn = CountingConnection(raw)
        approach.acquire(conn, "warm", 0)  # type: ignore[arg-type]  # the lock row exists from here on
        approach.release(conn)  # type: ignore[arg-type]
        meter.execute("CHECKPOINT")
        meter.execute("SELECT pg_stat_statements_reset()")
        conn.statements = 0
        before = wal_lsn(meter)
        done = 0
        while done < acquisitions:
            if approach.acquire(conn, f"h{done % 2}", 0):  # type: ignore[arg-type]
                done += 1
                approach.release(conn)  # type: ignore[arg-type]
        after = wal_lsn(meter)
        counts = statements_since_reset(meter, dbname)
    client = [v for q, v in counts.items() if "pg_current_wal_lsn" not in q and "CHECKPOINT" not in q]
    completed = sum(calls for calls, _ in client)
    server_ms = sum(total for _, total in client)
    return Cost(
        conn.statements / acquisitions,
        completed / acquisitions,
        server_ms / acquisitions,
        (after - before) / acquisitions,
    )


def run(dsn: str, dbname: str, *, seconds: float = 4.0, clients: int = 16) -> list[Table]:
    prepare(dsn)
    single = Table(
        f"Lease acquire, one client ({seconds:g} s each)",
        [
            "approach",
            "acquisitions/s",
            "ratio to ours",
            "p50 ms",
            "p99 ms",
            "statements sent per acquisition (completed)",
            "server execution ms per acquisition",
            "WAL bytes per acquisition",
            "release",
        ],
    )
    contended = Table(
        f"Lease acquire, {clients} client processes on one lock ({seconds:g} s each)",
        ["approach", "mode", "answers/s", "acquisitions/s", "ratio to ours (answers/s)", "p50 ms", "p99 ms"],
    )
    ours_rate = 0.0
    ours_answers: dict[str, float] = {}
    for index, approach in enumerate(APPROACHES):
        reset_lock(dsn, approach)
        sample = client_loop(dsn, index, "solo", seconds, 0.0, time.time())
        rate = sample.wins / sample.seconds
        ours_rate = ours_rate or rate
        cost = cost_per_acquisition(dsn, dbname, approach, 2000)
        lat = sample.latencies or []
        single.add(
            approach.name,
            f"{rate:.0f}",
            f"{rate / ours_rate:.2f}",
            ms(percentile(lat, 0.5)),
            ms(percentile(lat, 0.99)),
            f"{cost.sent:.2f} ({cost.completed:.2f})",
            f"{cost.server_ms:.3f}",
            f"{cost.wal_bytes:.0f}",
            approach.release_note,
        )
        for mode, hold in (("churn", 0.0), ("held 100 ms", 0.1)):
            reset_lock(dsn, approach)
            samples = contend(dsn, index, clients, seconds, hold)
            span = max(s.seconds for s in samples)
            answers = sum(s.calls for s in samples) / span
            wins = sum(s.wins for s in samples) / span
            ours_answers.setdefault(mode, answers)
            lat = [x for s in samples for x in (s.latencies or [])]
            contended.add(
                approach.name,
                mode,
                f"{answers:.0f}",
                f"{wins:.0f}",
                f"{answers / ours_answers[mode]:.2f}",
                ms(percentile(lat, 0.5)),
                ms(percentile(lat, 0.99)),
            )
    single.notes.append(
        "Statements sent: every statement the client sends per acquisition, i.e. round trips, counted at the"
        " client; it includes a refused INSERT and the release statement the advisory locks need before the"
        " next acquisition. In brackets: statements the server completed (pg_stat_statements, top level;"
        " it leaves out failed ones and transaction control). WAL: bytes of WAL written per acquisition"
        " over 2,000 acquisitions after a CHECKPOINT (full-page images included). Server execution:"
        " pg_stat_statements' execution time of those statements, without the commit's WAL flush."
    )
    contended.notes.append(
        "churn: every winner lets go at once (lease of 1 µs, or immediate unlock/commit), so every call can"
        " win; held: each winner keeps the lock 100 ms, so most calls lose. Latency is per acquire call."
    )
    return [single, contended]
