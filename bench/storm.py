"""The top of the minute: 5,000 locks, each contended by 2 clusters at the same instant.

A fleet fires most of its jobs at the start of a minute, and every guarded job of every
cluster asks the database at once. Here that is 10,000 acquire calls, one per pod, each on
its own client connection to a real PgBouncer in transaction mode (Debian's `pgbouncer`,
started by `guardedcron_devenv.pgbouncer`: a pool of `--pool-size` server connections per
database, PgBouncer's default 20, SCRAM to PostgreSQL), the way a fleet's pods reach a shared
database. Each cluster is one client process holding its 5,000 pods' connections, opened
before the instant: a pod's start and its connection are not the database's work (the
connect phase is timed and reported apart). At the instant, every pod sends its call.

Approaches, each on its own database of one durable server, one after the other:
- guardedcron (the current schema): `acquire_v2` with the minute's slot, 60 s leases;
  every lock ran the minute before (acquired and released), so every lease is free and each lock has a
  winner and a loser (`slot-claimed` or `lease-held`) whose attempt is recorded;
- the insert-then-update pattern (two statements: the refused `INSERT`, then the `UPDATE ...
  WHERE lock_until <= now()`), no fence and no history.
Advisory locks cannot take part: through a transaction pooler a session lock stays on
whichever server session ran it, and a transaction lock ends with its one statement, so both
clusters would "win".

Measured: the storm's time (the instant to the last answer), the losers' and the winners'
answer latency (from each call's send, and from the instant), winners per lock (must be
exactly 1), WAL bytes (`pg_current_wal_lsn()` over the storm, after a CHECKPOINT), the
server's execution time per call (pg_stat_statements, top-level statements), and the load.

    .venv/bin/python -m bench.storm                  # 5,000 locks x 2 clusters, ours then the pattern
    .venv/bin/python -m bench.storm --locks 1000 --only guardedcron
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    Table,
    connect,
    cpu_seconds,
    machine_line,
    percentile,
    statements_since_reset,
    wal_lsn,
)
from bench.lease_acquire import database
from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres

CLUSTERS = ("east", "west")
LOCK_PREFIX = "storm/job-"
CONNECT_AT_ONCE = 64  # connections a cluster process opens at a time before the storm
START_MARGIN_S = 1.0  # from "every pod connected" to the instant
APPROACHES = ("guardedcron", "insert-then-update")
LABELS = {
    "guardedcron": "guardedcron: acquire_v2",
    "insert-then-update": "insert-then-update (ShedLock JDBC pattern)",
}
ACQUIRE = "SELECT acquired, reason FROM guardedcron.acquire_v2(%s, %s, 60, 0, %s, 90, 10000)"
PATTERN_INSERT = (
    "INSERT INTO bench_shedlock (name, lock_until, locked_at, locked_by)"
    " VALUES (%s, now() + interval '60 s', now(), %s)"
)
PATTERN_UPDATE = (
    "UPDATE bench_shedlock SET lock_until = now() + interval '60 s', locked_at = now(), locked_by = %s"
    " WHERE name = %s AND lock_until <= now()"
)


@dataclass(frozen=True)
class Call:
    lock: int
    sent: float  # seconds after the instant
    answered: float
    won: bool
    reason: str


# --- one cluster: its pods' connections, then every call at the instant -----------------
async def _attempt(
    conn: psycopg.AsyncConnection[Any], approach: str, lock: int, holder: str, slot: int
) -> tuple[bool, str]:
    name = f"{LOCK_PREFIX}{lock}"
    if approach == "insert-then-update":
        try:
            await conn.execute(PATTERN_INSERT, (name, holder))
            return True, "inserted"
        except psycopg.errors.UniqueViolation:
            cur = await conn.execute(PATTERN_UPDATE, (holder, name))
            return cur.rowcount == 1, "updated" if cur.rowcount == 1 else "held"
    row = await (await conn.execute(ACQUIRE, (name, holder, slot))).fetchone()
    assert row is not None
    return bool(row[0]), str(row[1])


async def _cluster(
    dsn: str, approach: str, cluster: str, locks: int, slot: int, ready: Any, go: Any
) -> tuple[float, float, list[Call]]:
    """(connect phase seconds, CPU seconds of this process in the storm, its pods' calls)"""
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)

    async def open_one() -> psycopg.AsyncConnection[Any]:
        async with gate:
            return await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, prepare_threshold=None, application_name=f"{cluster}-pod"
            )

    began = time.perf_counter()
    pods = await asyncio.gather(*(open_one() for _ in range(locks)))
    connect_seconds = time.perf_counter() - began
    ready.put(connect_seconds)
    instant = float(go.get())  # every cluster gets the same instant

    async def pod(index: int) -> Call:
        await asyncio.sleep(max(0.0, instant - time.time()))
        sent = time.time() - instant
        won, reason = await _attempt(pods[index], approach, index, f"{cluster}/job-{index}-{slot}-pod", slot)
        return Call(index, sent, time.time() - instant, won, reason)

    cpu = time.process_time()
    calls = await asyncio.gather(*(pod(i) for i in range(locks)))
    cpu = time.process_time() - cpu
    for conn in pods:
        await conn.close()
    return connect_seconds, cpu, list(calls)


def _cluster_process(args: tuple[str, str, str, int, int, Any, Any]) -> tuple[float, float, list[Call]]:
    dsn, approach, cluster, locks, slot, ready, go = args
    return asyncio.run(_cluster(dsn, approach, cluster, locks, slot, ready, go))


# --- one storm ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Storm:
    approach: str
    locks: int
    connect_seconds: float
    calls: list[Call]
    wal_bytes: int
    server_ms_per_call: float
    blocks_per_call: float
    statements: int
    load: tuple[float, float]  # 1-minute load average before and after
    cpu: tuple[float, float, float]  # CPU seconds in the storm: PostgreSQL, PgBouncer, the clusters


def prepare(admin_dsn: str, approach: str, locks: int, slot: int) -> None:
    """Every lock ran the minute before (acquired and released): free, with a short history."""
    with connect(admin_dsn) as conn:
        if approach == "insert-then-update":
            conn.execute("DELETE FROM bench_shedlock")
            conn.execute(
                "INSERT INTO bench_shedlock (name, lock_until, locked_at, locked_by)"
                " SELECT %s || g, now() - interval '1 s', now() - interval '61 s', 'before'"
                " FROM generate_series(0, %s - 1) g",
                (LOCK_PREFIX, locks),
            )
        else:
            conn.execute(
                f"""DO $$ DECLARE f bigint; BEGIN
                    FOR g IN 0..{int(locks) - 1} LOOP
                        SELECT fence INTO f FROM guardedcron.acquire_v2(
                            '{LOCK_PREFIX}' || g, 'before', 60, 0, {int(slot) - 1}, 90, 10000);
                        PERFORM guardedcron.release_v2('{LOCK_PREFIX}' || g, 'before', f, 'succeeded', '');
                        COMMIT;  -- one lock's run a transaction, as its guard would
                    END LOOP; END $$""".encode()
            )
        conn.execute("VACUUM ANALYZE")


def server_pids(server: ThrowawayPostgres) -> list[int]:
    """The postmaster and every process it started (backends, WAL writer, checkpointer...)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(status.parent.name))
    return [postmaster, *children]


def cpu_of(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        try:
            found[pid] = cpu_seconds(pid)
        except OSError:
            continue
    return found


def storm(
    server: ThrowawayPostgres, bouncer: PgBouncer, admin_dsn: str, dbname: str, approach: str, locks: int
) -> Storm:
    pooled_dsn = bouncer.dsn_for(admin_dsn)
    assert bouncer.proc is not None
    slot = int(time.time()) // 60
    prepare(admin_dsn, approach, locks, slot)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(len(CLUSTERS)) as pool:
        ready, go = manager.Queue(), manager.Queue()
        pending = pool.map_async(
            _cluster_process,
            [(pooled_dsn, approach, cluster, locks, slot, ready, go) for cluster in CLUSTERS],
        )
        connect_seconds = max(ready.get(timeout=600) for _ in CLUSTERS)
        with connect(admin_dsn, "meter") as meter:
            meter.execute("CHECKPOINT")
            meter.execute("SELECT pg_stat_statements_reset()")
            wal_before = wal_lsn(meter)
            load_before = os.getloadavg()[0]
            database_before = cpu_of(server_pids(server))
            pooler_before = cpu_seconds(bouncer.proc.pid)
            instant = time.time() + START_MARGIN_S
            for _ in CLUSTERS:
                go.put(instant)
            results = pending.get(timeout=600)
            database_after = cpu_of(server_pids(server))
            pooler = cpu_seconds(bouncer.proc.pid) - pooler_before
            wal_after = wal_lsn(meter)
            counts = statements_since_reset(meter, dbname)
            blocks = meter.execute(
                "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND s.toplevel",
                (dbname,),
            ).fetchone()
    measured = [v for q, v in counts.items() if "pg_current_wal_lsn" not in q and "CHECKPOINT" not in q]
    statements = sum(calls for calls, _ in measured)
    total_ms = sum(total for _, total in measured)
    calls = [call for _, _, cluster_calls in results for call in cluster_calls]
    # A backend the pooler opened during the storm counts from zero.
    database = sum(after - database_before.get(pid, 0.0) for pid, after in database_after.items())
    return Storm(
        approach,
        locks,
        connect_seconds,
        calls,
        wal_after - wal_before,
        total_ms / len(calls),
        (int(blocks[0]) if blocks else 0) / len(calls),
        statements,
        (load_before, os.getloadavg()[0]),
        (database, pooler, sum(cpu for _, cpu, _ in results)),
    )


def row(table: Table, result: Storm) -> None:
    losers = [c for c in result.calls if not c.won]
    winners = [c for c in result.calls if c.won]
    won_locks = [c.lock for c in winners]
    one_each = len(won_locks) == len(set(won_locks)) == result.locks

    def latency(calls: list[Call], fraction: float, from_instant: bool = False) -> str:
        values = [c.answered - (0.0 if from_instant else c.sent) for c in calls]
        return f"{percentile(values, fraction) * 1000:.0f}"

    table.add(
        LABELS[result.approach],
        f"{max(c.answered for c in result.calls):.2f}",
        f"{len(winners):,} / {result.locks:,}" + ("" if one_each else " (NOT one per lock)"),
        f"{latency(losers, 0.5)} / {latency(losers, 0.99)} / {latency(losers, 1.0)}",
        latency(losers, 0.99, from_instant=True),
        f"{latency(winners, 0.5)} / {latency(winners, 0.99)}",
        f"{result.wal_bytes / 2**20:.1f} ({result.wal_bytes / len(result.calls):.0f})",
        f"{result.server_ms_per_call:.3f}",
        f"{result.blocks_per_call:.1f}",
        f"{result.statements / len(result.calls):.2f}",
        " / ".join(f"{seconds:.1f}" for seconds in result.cpu),
        f"{result.connect_seconds:.1f}",
        f"{result.load[0]:.1f} → {result.load[1]:.1f}",
    )


def run(server: ThrowawayPostgres, *, locks: int, pool_size: int, only: list[str]) -> Table:
    table = Table(
        f"The top of the minute, {locks:,} locks x {len(CLUSTERS)} clusters"
        f" = {locks * len(CLUSTERS):,} acquire calls through PgBouncer (transaction mode, pool {pool_size})",
        [
            "approach",
            "storm s (instant → last answer)",
            "winners / locks",
            "loser answer ms from its send: p50 / p99 / max",
            "loser p99 ms from the instant",
            "winner ms p50 / p99",
            "WAL MiB (bytes per call)",
            "server ms per call",
            "buffers per call",
            "statements per call",
            "CPU s in the storm: PostgreSQL / PgBouncer / clients",
            "connect phase s (not in the storm)",
            "load average before → after",
        ],
    )
    admin = server.dsn()
    # The pods' logins are not the storm: `trust` between them and the pooler spares the
    # connect phase 10,000 SCRAM exchanges on a 2-core machine (the pooler still logs in to
    # PostgreSQL with SCRAM, with the password of its auth file).
    settings = {"max_client_conn": str(locks * len(CLUSTERS) + 100), "auth_type": "trust"}
    with PgBouncer(admin, pool_size=pool_size, settings=settings) as bouncer:
        for approach in only:
            name = f"storm_{approach.replace('-', '_')}"
            dsn = database(server, name)
            row(table, storm(server, bouncer, dsn, name, approach, locks))
            print(table.markdown(), flush=True)
    table.notes.append(
        "Each cluster is one process holding its pods' connections (asyncio, psycopg, no prepared"
        " statements), opened before the instant; every pod sends its one call at the instant (the"
        " pattern's pods send two statements when the INSERT is refused). The server is durable"
        " (fsync, synchronous commit). Latency from the send is what a pod waits for its answer; from the"
        " instant it also counts the client process reaching that pod's send. Server ms per call:"
        " pg_stat_statements' execution time of every statement of the storm over the calls; buffers:"
        " the shared buffers they touched (hit or read), which the load does not change. WAL: the"
        " storm's, after a CHECKPOINT (full-page images included). CPU: seconds used from the instant to the"
        " last answer by the server's processes, the pooler, and the two cluster processes (their own"
        " count). The connection's user is the"
        " superuser (the owner's shortcut of the grant check): PgBouncer's auth file holds one user."
    )
    return table


def main() -> int:
    from bench.common import durable_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=5000)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--only", nargs="+", choices=APPROACHES, default=list(APPROACHES))
    args = parser.parse_args()
    with durable_server() as server:
        print(machine_line(server) + "\n", flush=True)
        print(run(server, locks=args.locks, pool_size=args.pool_size, only=args.only).markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
