"""Taking a lease: guardedcron before and after issue 10, and the peers' patterns, side by side.

Every approach takes the lock and, once it has it, lets it go (a guard does both: acquire
before the run, release after it), so the next caller can win at once:

- **guardedcron, before**: `acquire_v1` + `release_v1` on a database at schema version 2,
  migrated by the code of `bench.common.BEFORE_COMMIT`.
- **guardedcron, after**: `acquire_v2` + `release_v2` (fenced) at the current schema
  version, and `acquire_v1` + `release_v1` there too: what guards already deployed call.
- **insert-then-update** (the pattern of ShedLock's JDBC provider, rewritten here): an
  `INSERT` of the lock row, and when the row exists (duplicate key) an `UPDATE ... WHERE
  lock_until <= now()`; unlocking sets `lock_until` to now. No fence, no history.
- **advisory (session)**: `pg_try_advisory_lock(key)`, released by `pg_advisory_unlock`.
- **advisory (transaction)**: `BEGIN; SELECT pg_try_advisory_xact_lock(key)`, released by
  `COMMIT`.

Measured per approach: single-client rate and latency; 16 client processes contending
for one lock, either with the lock let go at once ("churn": every caller can win) or
held for 100 ms by each winner ("held": most callers lose); statements sent per acquisition
(counted at the client: round trips; a PL/pgSQL function call is one), the server's
execution time of those statements (pg_stat_statements), and WAL bytes per acquisition
(`pg_current_wal_lsn()` difference over a run, after a checkpoint).
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
    Tree,
    connect,
    median,
    migrated_database,
    ms,
    percentile,
    statements_since_reset,
    wal_lsn,
)
from guardedcron_devenv.postgres import ThrowawayPostgres

LOCK = "bench-lock"
ADVISORY_KEY = 4242
LEASE = 0.1  # seconds: the shortest lease acquire_v2 grants (contract.MIN_LEASE_SECONDS)

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
def v1_acquire(conn: Connection, holder: str, hold: float) -> Token | None:
    row = conn.execute(
        "SELECT acquired, fence FROM guardedcron.acquire_v1(%s, %s, %s, 0, NULL, 90, 10000)",
        (LOCK, holder, max(hold, LEASE)),
    ).fetchone()
    return int(row[1]) if row and row[0] else None


def v1_release(conn: Connection, holder: str, fence: Token) -> None:
    conn.execute("SELECT released FROM guardedcron.release_v1(%s, %s, 'finished', '')", (LOCK, holder))


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
    release_note: str
    schema: str = "after"  # which database: "before" (BEFORE_COMMIT's schema) or "after"
    history_rows: int = 0  # guardedcron only: the lock's history when the measurement starts


APPROACHES = (
    Approach("guardedcron before: acquire_v1, schema 2", v1_acquire, v1_release, "release_v1", "before"),
    Approach("guardedcron after: acquire_v2, current schema", v2_acquire, v2_release, "release_v2 (fenced)"),
    Approach(
        "guardedcron after: acquire_v1 on the current schema (deployed guards)",
        v1_acquire,
        v1_release,
        "release_v1",
    ),
    Approach(
        "guardedcron before: acquire_v1, history at its 10,000-row cap",
        v1_acquire,
        v1_release,
        "release_v1",
        "before",
        history_rows=10_000,
    ),
    Approach(
        "guardedcron after: acquire_v2, history at its 10,000-row cap",
        v2_acquire,
        v2_release,
        "release_v2 (fenced)",
        history_rows=10_000,
    ),
    Approach(
        "insert-then-update (ShedLock JDBC pattern)", shedlock_acquire, shedlock_release, "UPDATE lock_until"
    ),
    Approach("pg_try_advisory_lock", advisory_acquire, advisory_release, "pg_advisory_unlock"),
    Approach("pg_try_advisory_xact_lock", xact_acquire, xact_release, "COMMIT"),
)


# Issue 11: the same acquisition on schema 3 (SECURITY INVOKER, no grant check) and on
# schema 4 (SECURITY DEFINER entry points with a pinned search_path and the prefix check),
# each migrated from this tree's own migration files, on one server in one run. The tenant
# logs in as its own role, granted "bench-" among TENANT_GRANTS other tenants' prefixes.
TENANT_PREFIX = "bench-"
TENANT_GRANTS = 200
TENANCY_APPROACHES = (
    Approach("schema 3: acquire_v2 as the superuser", v2_acquire, v2_release, "release_v2", "schema3"),
    Approach(
        "schema 4: acquire_v2 as the superuser (owner's shortcut)",
        v2_acquire,
        v2_release,
        "release_v2",
        "schema4",
    ),
    Approach(
        f"schema 4: acquire_v2 as a tenant role (prefix check among {TENANT_GRANTS + 1} grants)",
        v2_acquire,
        v2_release,
        "release_v2",
        "tenant",
    ),
)
# Issue 13: schema 6 (no index on running runs, one statement per step) beside schema 7
# (the same, with a loss's record committed without waiting for a flush), each with a short
# history and with the lock's history at its 10,000-run cap, and the peers' patterns, on one
# server in one run. (Schema 5 beside 6 was this section's comparison the round before.)
CAP = 10_000
RETENTION_APPROACHES = (
    Approach("schema 6: acquire_v2, short history", v2_acquire, v2_release, "release_v2", "schema6"),
    Approach(
        "schema 6: acquire_v2, history at its 10,000-run cap",
        v2_acquire,
        v2_release,
        "release_v2",
        "schema6",
        history_rows=CAP,
    ),
    Approach("schema 7: acquire_v2, short history", v2_acquire, v2_release, "release_v2", "schema7"),
    Approach(
        "schema 7: acquire_v2, history at its 10,000-run cap",
        v2_acquire,
        v2_release,
        "release_v2",
        "schema7",
        history_rows=CAP,
    ),
    Approach(
        "insert-then-update (ShedLock JDBC pattern)",
        shedlock_acquire,
        shedlock_release,
        "UPDATE lock_until",
        "schema7",
    ),
    Approach("pg_try_advisory_lock", advisory_acquire, advisory_release, "pg_advisory_unlock", "schema7"),
    Approach("pg_try_advisory_xact_lock", xact_acquire, xact_release, "COMMIT", "schema7"),
)
PEER = "insert-then-update (ShedLock JDBC pattern)"


def prepare(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(SHEDLOCK_TABLE)


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
    """The same starting point for every measurement: lock rows gone, history as the approach says.

    The history is one winning run a minute, oldest first; from schema 5 numbered as its
    generations, and the lease row (made again by the first acquisition) counts on from them.
    """
    with connect(dsn) as conn:
        conn.execute("DELETE FROM bench_shedlock")
        conn.execute("DELETE FROM guardedcron.runs WHERE lock_name = %s", (LOCK,))
        conn.execute("DELETE FROM guardedcron.leases WHERE lock_name = %s", (LOCK,))
        numbered = conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_schema = 'guardedcron' AND table_name = 'runs' AND column_name = 'generation'"
        ).fetchone()
        columns, values = ("", "") if numbered is None else (", generation", ", %(rows)s + 1 - g")
        conn.execute(
            "INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, finished_at, outcome"
            f"{columns}) SELECT %(lock)s, 'old', -g, now() - make_interval(mins => g),"
            f" now() - make_interval(mins => g), 'succeeded'{values}"
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
    server: ThrowawayPostgres, before: Tree, after: Tree, *, seconds: float = 4.0, clients: int = 16
) -> list[Table]:
    trees = {"before": before, "after": after}
    databases = {key: f"lease_{key}" for key in trees}
    dsns = {key: migrated_database(server, databases[key], tree) for key, tree in trees.items()}
    for dsn in dsns.values():
        prepare(dsn)
    single = Table(
        f"Lease acquire and release, one client ({seconds:g} s each)",
        [
            "approach",
            "acquisitions/s",
            "ratio to before",
            "acquire p50 ms",
            "acquire p99 ms",
            "release p50 ms",
            "statements sent per acquisition (completed)",
            "server execution ms per acquisition",
            "WAL bytes per acquisition",
            "release",
        ],
    )
    contended = Table(
        f"Lease acquire, {clients} client processes on one lock ({seconds:g} s each)",
        [
            "approach",
            "mode",
            "answers/s",
            "acquisitions/s",
            "ratio to before (answers/s)",
            "p50 ms",
            "p99 ms",
        ],
    )
    reference_rate = 0.0
    reference_answers: dict[str, float] = {}
    for approach in APPROACHES:
        dsn = dsns[approach.schema]
        reset_lock(dsn, approach)
        sample = client_loop(dsn, approach, "solo", seconds, 0.0, time.time())
        rate = sample.wins / sample.seconds
        reference_rate = reference_rate or rate
        cost = cost_per_acquisition(dsn, databases[approach.schema], approach, 2000)
        single.add(
            approach.name,
            f"{rate:.0f}",
            f"{rate / reference_rate:.2f}",
            ms(percentile(sample.latencies, 0.5)),
            ms(percentile(sample.latencies, 0.99)),
            ms(percentile(sample.release_latencies, 0.5)),
            f"{cost.sent:.2f} ({cost.completed:.2f})",
            f"{cost.server_ms:.3f}",
            f"{cost.wal_bytes:.0f}",
            approach.release_note,
        )
        for mode, hold in (("churn", 0.0), ("held 100 ms", 0.1)):
            reset_lock(dsn, approach)
            samples = contend(dsn, approach, clients, seconds, hold)
            span = max(s.seconds for s in samples)
            answers = sum(s.calls for s in samples) / span
            wins = sum(s.wins for s in samples) / span
            reference_answers.setdefault(mode, answers)
            latencies = [x for s in samples for x in s.latencies]
            contended.add(
                approach.name,
                mode,
                f"{answers:.0f}",
                f"{wins:.0f}",
                f"{answers / reference_answers[mode]:.2f}",
                ms(percentile(latencies, 0.5)),
                ms(percentile(latencies, 0.99)),
            )
    single.notes.append(
        "Every approach takes the lock and lets it go (two holders in turn, so each acquisition is a"
        f" takeover); guardedcron's leases are {LEASE:g} s, the shortest acquire_v2 grants."
        " Statements sent: every statement the client sends per acquisition, release included, i.e."
        " round trips, counted at the client (a refused INSERT counts). In brackets: statements the"
        " server completed (pg_stat_statements, top level; it leaves out failed ones and transaction"
        " control). Server execution: pg_stat_statements' execution time of those statements, without"
        " the commit's WAL flush. WAL: bytes written per acquisition over 2,000 acquisitions after a"
        " CHECKPOINT (full-page images included). Before: schema 2, migrated by the code of"
        f" {before.label}; after: the working tree's schema, on the same server."
    )
    contended.notes.append(
        "churn: every winner lets go at once, so every call can win; held: each winner keeps the lock"
        " 100 ms, so most calls lose. Latency is per acquire call."
    )
    return [single, contended]


# --- issue 11: schema 3 beside schema 4, one run ------------------------------------------
def schema_database(server: ThrowawayPostgres, name: str, version: int) -> str:
    """A new database at schema `version`, from this tree's migration files, ready for every approach."""
    from guardedcron.guard.migrations import load_migrations

    dsn = server.create_database(name)
    with connect(dsn) as conn, conn.transaction():
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CREATE SCHEMA guardedcron")
        conn.execute(
            "CREATE TABLE guardedcron.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        for migration in load_migrations():
            if migration.version <= version:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO guardedcron.schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
    prepare(dsn)
    return dsn


def tenancy_databases(server: ThrowawayPostgres) -> dict[str, tuple[str, str, str]]:
    """approach.schema -> (client DSN, superuser DSN, database name)."""
    from guardedcron.guard.grants import grant

    found: dict[str, tuple[str, str, str]] = {}
    for key, version in (("schema3", 3), ("schema4", 4)):
        name = f"tenancy_{key}"
        dsn = schema_database(server, name, version)
        found[key] = (dsn, dsn, name)
    schema4, _, name = found["schema4"]
    password = "bench-tenant-password"
    with connect(schema4) as conn:
        conn.execute("DROP ROLE IF EXISTS bench_tenant")
        conn.execute(f"CREATE ROLE bench_tenant LOGIN PASSWORD '{password}'")
        conn.execute(
            "INSERT INTO guardedcron.lock_grants (role, prefix)"
            " SELECT 10, 'tenant-' || g || '/' FROM generate_series(1, %s) g",
            (TENANT_GRANTS,),
        )  # other tenants' grants (role 10: the bootstrap superuser; only their count matters)
        grant(conn, "bench_tenant", [TENANT_PREFIX])
    tenant = f"postgresql://bench_tenant:{password}@127.0.0.1:{server.port}/{name}"
    found["tenant"] = (tenant, schema4, name)
    return found


def run_tenancy(
    server: ThrowawayPostgres, *, seconds: float = 4.0, clients: int = 16, rounds: int = 3
) -> list[Table]:
    """Each round measures the three approaches in turn (rotated, so none is always first on a
    machine whose load drifts); the tables give the median of the rounds and their range."""
    databases = tenancy_databases(server)
    solo: dict[int, list[Sample]] = {i: [] for i in range(len(TENANCY_APPROACHES))}
    costs: dict[int, list[Cost]] = {i: [] for i in range(len(TENANCY_APPROACHES))}
    churn: dict[int, list[tuple[float, float, list[float]]]] = {i: [] for i in range(len(TENANCY_APPROACHES))}
    for round_number in range(rounds):
        order = list(range(len(TENANCY_APPROACHES)))
        order = order[round_number % len(order) :] + order[: round_number % len(order)]
        for offset in order:
            approach = TENANCY_APPROACHES[offset]
            dsn, admin, name = databases[approach.schema]
            reset_lock(admin, approach)
            solo[offset].append(client_loop(dsn, approach, "solo", seconds, 0.0, time.time()))
            costs[offset].append(cost_per_acquisition(dsn, name, approach, 2000, meter_dsn=admin))
            reset_lock(admin, approach)
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

    single = Table(
        f"Issue 11: acquire and release, schema 3 beside schema 4, one client"
        f" ({rounds} rounds of {seconds:g} s)",
        [
            "approach",
            "acquisitions/s",
            "acquire p50 ms",
            "acquire p99 ms",
            "release p50 ms",
            "server execution ms per acquisition",
            "WAL bytes per acquisition",
        ],
    )
    contended = Table(
        f"Issue 11: {clients} client processes on one lock, churn ({rounds} rounds of {seconds:g} s)",
        ["approach", "answers/s", "acquisitions/s", "p50 ms", "p99 ms"],
    )
    for offset, approach in enumerate(TENANCY_APPROACHES):
        latencies = [x for sample in solo[offset] for x in sample.latencies]
        releases = [x for sample in solo[offset] for x in sample.release_latencies]
        single.add(
            approach.name,
            spread([sample.wins / sample.seconds for sample in solo[offset]], 0),
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99)),
            ms(percentile(releases, 0.5)),
            spread([cost.server_ms for cost in costs[offset]], 3),
            spread([cost.wal_bytes for cost in costs[offset]], 0),
        )
        pooled = [x for _, _, lat in churn[offset] for x in lat]
        contended.add(
            approach.name,
            spread([answers for answers, _, _ in churn[offset]], 0),
            spread([wins for _, wins, _ in churn[offset]], 0),
            ms(percentile(pooled, 0.5)),
            ms(percentile(pooled, 0.99)),
        )
    single.notes.append(
        "Both databases are migrated from this tree's migration files (0001-0003 for schema 3, all for"
        " schema 4) on one durable server and measured in the same run, the approaches taking turns"
        " round by round. Median of the rounds, (min-max) in brackets; latency percentiles pool every"
        " round's calls. Server execution: pg_stat_statements' time of the acquire and release"
        " statements (top level) per acquisition, over 2,000 acquisitions after a CHECKPOINT."
        f" {LEASE:g} s leases, two holders in turn (every acquisition is a takeover)."
    )
    return [single, contended, call_costs(databases)]


def call_costs(databases: dict[str, tuple[str, str, str]], calls: int = 5_000, tries: int = 5) -> Table:
    """What the pieces cost inside the server, without the client, the network or a commit:
    a PL/pgSQL loop making `calls` calls, best of `tries` (the least disturbed by the load)."""
    schema3, _, _ = databases["schema3"]
    _, admin, _ = databases["schema4"]
    tenant, _, _ = databases["tenant"]
    # A renewal by no holder: the same small body (one UPDATE matching nothing, one SELECT)
    # on each side, so that the difference is the wrapper, the definer switch and the check.
    renew = f"* FROM guardedcron.renew_v2('{LOCK}', 'nobody', 1, 30)"
    body = f"* FROM guardedcron._renew_v2('{LOCK}', 'nobody', 1, 30)"
    rows = (
        ("schema 3: renew_v2 as the superuser (SECURITY INVOKER, no check)", schema3, renew),
        ("schema 4: _renew_v2 as the superuser (the same body, pinned search_path)", admin, body),
        ("schema 4: renew_v2 as the superuser (+ definer wrapper, owner's shortcut)", admin, renew),
        (
            f"schema 4: renew_v2 as the tenant (+ prefix check among {TENANT_GRANTS + 1} grants)",
            tenant,
            renew,
        ),
    )
    table = Table(
        f"Issue 11: cost per call inside the server ({calls:,} calls in a PL/pgSQL loop, best of {tries})",
        ["call", "µs per call"],
    )
    for label, dsn, call in rows:
        best = float("inf")
        with connect(dsn) as conn:
            conn.execute(call_loop(call, 100))  # warm: plans and caches
            for _ in range(tries):
                began = time.perf_counter()
                conn.execute(call_loop(call, calls))
                best = min(best, time.perf_counter() - began)
        table.add(label, f"{best / calls * 1e6:.1f}")
    table.notes.append(
        "acquire_v2 and release_v2 pay the same wrapper and check as renew_v2 (one each per call)."
    )
    return table


def compared_schema_databases(server: ThrowawayPostgres, prefix: str) -> dict[str, str]:
    """A database per schema the retention approaches compare ("schema6" -> migrations up
    to 6), named `<prefix>_<schema>`; the peers run on the last one."""
    schemas = sorted({approach.schema for approach in RETENTION_APPROACHES})
    return {key: schema_database(server, f"{prefix}_{key}", int(key[-1])) for key in schemas}


def call_loop(call: str, count: int) -> bytes:
    return f"DO $$ BEGIN FOR i IN 1..{count} LOOP PERFORM {call}; END LOOP; END $$".encode()


# --- issue 13: schema 6 beside schema 7, short history and at the cap, and the peers ------
def run_retention(
    server: ThrowawayPostgres, *, seconds: float = 3.0, clients: int = 16, rounds: int = 2, costed: int = 1000
) -> list[Table]:
    """As run_tenancy: rounds in rotated order, medians and ranges; the superuser everywhere."""
    databases = compared_schema_databases(server, "retention")
    count = len(RETENTION_APPROACHES)
    solo: dict[int, list[Sample]] = {i: [] for i in range(count)}
    costs: dict[int, list[Cost]] = {i: [] for i in range(count)}
    churn: dict[int, list[tuple[float, float, list[float]]]] = {i: [] for i in range(count)}
    for round_number in range(rounds):
        order = list(range(count))
        order = order[round_number % count :] + order[: round_number % count]
        for offset in order:
            approach = RETENTION_APPROACHES[offset]
            dsn = databases[approach.schema]
            name = f"retention_{approach.schema}"
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

    peer = next(i for i, a in enumerate(RETENTION_APPROACHES) if a.name == PEER)
    peer_rate = median([sample.wins / sample.seconds for sample in solo[peer]])
    peer_churn = median([wins for _, wins, _ in churn[peer]])
    single = Table(
        f"Issue 13: acquire and release, one client ({rounds} rounds of {seconds:g} s)",
        [
            "approach",
            "acquisitions/s",
            f"ratio to {PEER.split(' (')[0]}",
            "acquire p50 ms",
            "acquire p99 ms",
            "server ms per acquisition: acquire (+ release)",
            "buffers per acquire",
            "WAL bytes per acquisition",
        ],
    )
    contended = Table(
        f"Issue 13: {clients} client processes on one lock, churn ({rounds} rounds of {seconds:g} s)",
        ["approach", "answers/s", "acquisitions/s", f"ratio to {PEER.split(' (')[0]}", "p50 ms", "p99 ms"],
    )
    for offset, approach in enumerate(RETENTION_APPROACHES):
        rates = [sample.wins / sample.seconds for sample in solo[offset]]
        latencies = [x for sample in solo[offset] for x in sample.latencies]
        guarded = approach.name.startswith("schema")
        acquire_part = spread([c.acquire_ms for c in costs[offset]], 3) if guarded else "-"
        single.add(
            approach.name,
            spread(rates, 0),
            f"{median(rates) / peer_rate:.2f}",
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99)),
            f"{acquire_part} ({spread([c.server_ms for c in costs[offset]], 3)})",
            spread([c.acquire_blocks for c in costs[offset]], 1) if guarded else "-",
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
        "Both databases are migrated from this tree's migration files (0001-0006 for schema 6, all for"
        " schema 7) on one durable server; the peers' patterns run on the schema-7 database. Every approach"
        " takes the lock and lets it go, two holders in turn (every acquisition is a takeover,"
        f" {LEASE:g} s leases for ours). At the cap, the lock's history holds {CAP:,} winning runs before"
        " the measurement, so every win pushes one out. Median of the rounds, (min-max); latency"
        " percentiles pool every round's calls. Server ms: pg_stat_statements' execution time per"
        f" acquisition over {costed:,} acquisitions after a CHECKPOINT, the acquire statement alone, and in"
        " brackets every statement of the approach (release included, the commit's WAL flush not)."
        " Buffers: shared buffers the acquire statement touched (hit or read, its nested statements"
        " included), which the load does not change."
    )
    contended.notes.append(
        "churn: every winner lets go at once, so every call can win; ratio: acquisitions/s to the pattern's."
    )
    return [single, contended]


# --- issue 13: where an acquisition's server time goes, statement by statement -----------
def run_profile(server: ThrowawayPostgres, *, cycles: int = 1500) -> list[Table]:
    """Schema 6 beside schema 7, short history and at the cap: every statement the functions run
    (schema 5 beside 6 the round before; the approaches are the retention section's first four).

    Needs a server with pg_stat_statements tracking nested statements and planning
    (`profile_server`). One client, a takeover every call (acquire, then release), after a
    warm-up of 200 cycles and a CHECKPOINT: per acquisition, each statement's execution and
    planning ms, shared buffers, WAL bytes and records; and how many updates of `runs` were HOT.
    """
    tables = []
    databases = compared_schema_databases(server, "profile")
    for approach in RETENTION_APPROACHES[:4]:
        dsn, dbname = databases[approach.schema], f"profile_{approach.schema}"
        reset_lock(dsn, approach)
        with connect(dsn) as conn:
            for cycle in range(200 + cycles):
                if cycle == 200:
                    conn.execute("CHECKPOINT")
                    conn.execute("SELECT pg_stat_statements_reset()")
                    conn.execute("SELECT pg_stat_reset()")
                    before = wal_lsn(conn)
                holder = f"h{cycle % 2}"
                fence = v2_acquire(conn, holder, LEASE)
                assert fence is not None
                v2_release(conn, holder, fence)
            wal = (wal_lsn(conn) - before) / cycles
            rows = conn.execute(
                "SELECT s.toplevel, s.calls, s.total_exec_time, s.total_plan_time,"
                " s.shared_blks_hit + s.shared_blks_read, s.wal_bytes, s.wal_records,"
                " left(regexp_replace(s.query, '\\s+', ' ', 'g'), 70)"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s AND s.calls >= %s ORDER BY s.toplevel DESC, s.total_exec_time DESC",
                (dbname, cycles),
            ).fetchall()
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            updates = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relid = 'guardedcron.runs'::regclass"
            ).fetchone()
            assert updates is not None
        table = Table(
            f"Issue 13 profile: {approach.name} ({cycles:,} takeovers; WAL {wal:,.0f} bytes per acquire"
            f" and release; updates of runs: {updates[0]:,}, HOT {updates[1]:,})",
            [
                "statement (nested ones indented)",
                "calls per cycle",
                "exec ms",
                "plan ms",
                "buffers",
                "WAL bytes",
                "WAL records",
            ],
        )
        for top, calls, exec_ms, plan_ms, blocks, wal_bytes, records, text in rows:
            table.add(
                ("" if top else "&nbsp;&nbsp;") + f"`{text.replace('|', '/')}`",
                f"{calls / cycles:g}",
                f"{exec_ms / cycles:.3f}",
                f"{plan_ms / cycles:.3f}",
                f"{blocks / cycles:.1f}",
                f"{float(wal_bytes) / cycles:.0f}",
                f"{records / cycles:.2f}",
            )
        table.notes.append(
            "Per cycle (one acquire and one release). pg_stat_statements with track = all and"
            " track_planning: a nested statement's time is inside its caller's; the tracking itself"
            " costs every statement a little."
        )
        tables.append(table)
    return tables


def profile_server() -> ThrowawayPostgres:
    return ThrowawayPostgres(
        durable=True,
        settings=[
            ("shared_preload_libraries", "'pg_stat_statements'"),
            ("pg_stat_statements.track", "all"),
            ("pg_stat_statements.track_planning", "on"),
        ],
    )


def main() -> int:
    import argparse

    from bench.common import durable_server, machine_line

    parser = argparse.ArgumentParser(
        description="Lease acquisition: schema 3 beside 4 (issue 11, 'tenancy'), or schema 6 beside 7"
        " and the peers' patterns (issue 13, 'retention'), or schema 6 and 7 statement by statement"
        " (issue 13, 'profile')"
    )
    parser.add_argument("--section", choices=("tenancy", "retention", "profile"), default="tenancy")
    parser.add_argument("--seconds", type=float, help="per measurement (4 tenancy, 3 retention)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, help="3 tenancy, 2 retention")
    args = parser.parse_args()
    with profile_server() if args.section == "profile" else durable_server() as server:
        print(machine_line(server) + "\n")
        if args.section == "profile":
            tables = run_profile(server)
        elif args.section == "tenancy":
            tables = run_tenancy(
                server, seconds=args.seconds or 4.0, clients=args.clients, rounds=args.rounds or 3
            )
        else:
            tables = run_retention(
                server, seconds=args.seconds or 3.0, clients=args.clients, rounds=args.rounds or 2
            )
        for table in tables:
            print(table.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
