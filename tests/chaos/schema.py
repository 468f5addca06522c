"""The chaos suite's own tables: a job's business data, and the evidence the checks read.

The workload's data is what a billing job touches: a queue of source rows (its durable
checkpoint: a row's state says which step is done), invoices deduplicated by item, an
outbox deduplicated by key. Three more tables are evidence, written in the same
transaction as the effect they witness, and deliberately without unique keys so that a
second committed attempt shows up as a second row instead of an error:

- `effects`: one row per item per step, per committed transaction (charge, send, delete);
- `fenced_writes`: one row per committed fenced transaction, numbered by a sequence
  value drawn as the transaction's last statement, so the order of numbers is the order
  of commits relative to any takeover (which must wait for the fence check's lock);
- `refusals`: one row per fenced write the database refused, recorded by the refused
  process itself on a fresh connection.

`ledger` lists every item ever enqueued and `attempts` every contender the harness
started; the harness writes both, so the checks can ask the database alone.
"""

from __future__ import annotations

from typing import Any

import psycopg

from guardedcron_devenv.postgres import ThrowawayPostgres

SCHEMA_SQL = """
CREATE SCHEMA chaos;
CREATE SEQUENCE chaos.write_seq;

CREATE TABLE chaos.ledger (
    item        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_name   text   NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos.queue (
    item      bigint PRIMARY KEY,
    lock_name text   NOT NULL,
    state     text   NOT NULL CHECK (state IN ('pending', 'charged', 'sent'))
);
CREATE INDEX queue_outstanding ON chaos.queue (lock_name, state, item);

CREATE TABLE chaos.invoices (
    item         bigint PRIMARY KEY,  -- the dedupe key: one invoice per item
    amount_cents bigint NOT NULL,
    fence        bigint NOT NULL,
    holder       text   NOT NULL
);
CREATE TABLE chaos.outbox (
    dedupe_key text   PRIMARY KEY,
    item       bigint NOT NULL,
    fence      bigint NOT NULL,
    holder     text   NOT NULL
);

CREATE TABLE chaos.effects (
    item      bigint NOT NULL,
    kind      text   NOT NULL CHECK (kind IN ('charge', 'send', 'delete')),
    lock_name text   NOT NULL,
    fence     bigint NOT NULL,
    holder    text   NOT NULL,
    write_seq bigint NOT NULL,
    -- true when the dedupe key (or the state check) absorbed this attempt: the item
    -- had already been handled, so someone else believed they owned it too
    absorbed  boolean NOT NULL
);
CREATE INDEX effects_item ON chaos.effects (item, kind);

CREATE TABLE chaos.fenced_writes (
    write_seq  bigint PRIMARY KEY,
    lock_name  text   NOT NULL,
    fence      bigint NOT NULL,
    holder     text   NOT NULL,
    kind       text   NOT NULL,
    items      integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE chaos.refusals (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_name  text   NOT NULL,
    fence      bigint NOT NULL,
    holder     text   NOT NULL,
    kind       text   NOT NULL,
    refused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    message    text   NOT NULL
);

CREATE TABLE chaos.attempts (
    holder         text PRIMARY KEY,
    path           text NOT NULL CHECK (path IN ('process', 'connection')),
    lock_name      text NOT NULL,
    slot           bigint,
    answered       boolean NOT NULL,  -- the guard told this contender won or lost
    acquired       boolean NOT NULL,
    reason         text,
    run_id         bigint,
    fence          bigint,
    exit_code      integer,
    answer_seconds double precision,
    faults         text[] NOT NULL DEFAULT '{}'
);
"""


def create_schema(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    conn.execute(SCHEMA_SQL.encode())


def enqueue(
    conn: psycopg.Connection[tuple[Any, ...]], lock: str, count: int, *, outstanding_cap: int | None = None
) -> list[int]:
    """Add `count` new items of outstanding work for `lock`; returns their ids.

    With `outstanding_cap`, add only as many as keep the lock's outstanding items within it:
    rounds that come at a pace must not outrun a holder slowed by a loaded machine, or its
    job (which works until nothing is outstanding) would never end."""
    rows = conn.execute(
        """
        WITH room AS (
            SELECT least(%(count)s, %(cap)s - count(*)) AS n FROM chaos.queue WHERE lock_name = %(lock)s
        ), new AS (
            INSERT INTO chaos.ledger (lock_name)
            SELECT %(lock)s FROM room, generate_series(1, room.n)
            RETURNING item, lock_name
        )
        INSERT INTO chaos.queue (item, lock_name, state)
        SELECT item, lock_name, 'pending' FROM new
        RETURNING item
        """,
        {"lock": lock, "count": count, "cap": count if outstanding_cap is None else outstanding_cap},
    ).fetchall()
    return [int(r[0]) for r in rows]


def create_database(server: ThrowawayPostgres, name: str) -> str:
    """A new database with the guardedcron schema and the chaos tables; returns its DSN."""
    from guardedcron.guard.migrations import migrate

    dsn = server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        create_schema(conn)
    return dsn
