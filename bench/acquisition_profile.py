"""What each part of acquire_v2 and release_v2 costs the server, one part at a time (issue 13).

`bench/acquisition_floor.py` shows that the one-client gap to the insert-then-update
pattern is our checks, not the history. This module says which check costs what. It reads
the shipped functions' definitions from the migrated database (`pg_get_functiondef`),
and makes bench-only copies in a schema `bench_profile`, each with one part cut out of the
body (a part whose text is not found stops the run: the cuts follow the shipped source,
they are not a second copy of it). **A cut is not a candidate schema**: each drops
something the guarantee or the bounds need. The few variants marked "candidate" keep the
part's meaning in a cheaper form; they show what such a form would save.

Each variant runs in a server-side procedure that commits after every call, so the figure
is the server's time per call with no client and no round trip. The server is the tests'
throwaway one without fsync, and the session commits without waiting for the WAL
(`synchronous_commit = off`): what differs between variants is the work of the call, not
the flush, which is the same for all and is what makes the machine's timings jitter. A
variant's saving is the paired median: over rounds, the shipped time minus the variant's
in the same round; an exact copy of the shipped function is the control. The guard's
path is measured: every win claims the next slot (slots 1, 2, 3, ...); a loss is a call
for a lock another holder keeps for a day. History stays under its cap, so retention
finds nothing to delete and its figure is the cost of looking. Rounds alternate the order.

    nice -n 5 .venv/bin/python -m bench.acquisition_profile [--rounds 20] [--calls 150]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from bench.acquisition_floor import FLOOR_SQL
from bench.common import Connection, Table, connect, fresh_database, machine_line
from guardedcron_devenv.postgres import ThrowawayPostgres

Cut = Callable[[str], str]


def remove(text: str, replacement: str = "") -> Cut:
    def cut(body: str) -> str:
        if body.count(text) != 1:
            raise RuntimeError(f"the shipped function no longer has exactly one {text[:60]!r}")
        return body.replace(text, replacement)

    return cut


def remove_between(first: str, up_to: str, replacement: str = "") -> Cut:
    """Cut from `first` to just before `up_to`."""

    def cut(body: str) -> str:
        start = body.find(first)
        end = body.find(up_to, start)
        if start < 0 or end < 0 or body.count(first) != 1:
            raise RuntimeError(f"the shipped function no longer has {first[:60]!r} ... {up_to[:40]!r}")
        return body[:start] + replacement + body[end:]

    return cut


GRANT = remove("    PERFORM guardedcron._require_grant(p_lock);\n")
ARGUMENT_CHECKS = remove_between("    PERFORM guardedcron._check_lease_seconds", "    lease := make_interval")
LOCK_TIMEOUT = remove("        PERFORM set_config('lock_timeout', '5s', true);\n")
RETRIED_CALL = remove_between(
    "        IF cur.locked_until > t AND cur.holder = p_holder AND cur.slot", "        -- A slot runs once"
)
SLOT_CHECK = remove_between(
    "        IF p_slot IS NOT NULL THEN\n            SELECT * INTO claim",
    "        IF cur.locked_until > t THEN",
)
SLOT_CLAIM = remove_between("), claimed AS (", "        SELECT won.id INTO new_run", ")\n")
ABANDONED = [
    remove_between("        WITH abandoned AS (", "), won AS ("),
    remove("), won AS (", "        WITH won AS ("),
]
FENCE_GUARDS = remove_between(
    "        BEGIN\n            new_fence := nextval",
    "        new_generation :=",
    "        new_fence := nextval('guardedcron.fences');\n",
)


def inline_grant(require_grant: str) -> Cut:
    """A candidate, not a cut: the shipped _require_grant's test (read from its definition)
    inline, with no nested call and no SET clause of its own; a refusal still raises GC003
    through the shipped function."""
    head, tail = "    IF p_lock IS NOT NULL AND (", ") THEN\n        RETURN;"
    start = require_grant.find(head)
    end = require_grant.find(tail, start)
    if start < 0 or end < 0:
        raise RuntimeError("the shipped _require_grant no longer tests `p_lock IS NOT NULL AND (...)`")
    test = require_grant[start + len("    IF ") : end + 1]
    return remove(
        "    PERFORM guardedcron._require_grant(p_lock);\n",
        f"    IF NOT ({test}) THEN\n        PERFORM guardedcron._require_grant(p_lock);\n    END IF;\n",
    )


# A candidate: retention on one win in four (by generation), with four times the batch, so
# the same rows go at the same rate and no call deletes more than 64 of each table.
RETENTION_ONE_WIN_IN_FOUR = [
    remove("    retention_batch CONSTANT integer := 16;", "    retention_batch CONSTANT integer := 64;"),
    remove("        WITH keep AS (", "        IF new_generation % 4 = 0 THEN\n        WITH keep AS ("),
    remove(
        "ORDER BY o.claimed_at LIMIT retention_batch));\n",
        "ORDER BY o.claimed_at LIMIT retention_batch));\n        END IF;\n",
    ),
]
RETENTION = remove_between("        WITH keep AS (", "        RETURN QUERY SELECT true, 'acquired'")
LOSS_REASON = remove(
    "        lost_why := format('lease held by %s (fence %s) until %s',"
    " cur.holder, cur.fence, cur.locked_until);\n",
    "        lost_why := 'lease held';\n",
)


ACQUIRE_PARTS: dict[str, list[Cut]] = {
    "the grant check": [GRANT],
    "the argument checks": [ARGUMENT_CHECKS],
    "the lock timeout": [LOCK_TIMEOUT],
    "the retried-call answer": [RETRIED_CALL],
    "the slot: its check and its claim": [SLOT_CHECK, SLOT_CLAIM],
    "the abandoned run's record": ABANDONED,
    "the fence's guards (its exception block)": [FENCE_GUARDS],
    "retention (looking; nothing to delete)": [RETENTION],
}
LOSS_PARTS: dict[str, list[Cut]] = {
    "the grant check": [GRANT],
    "the argument checks": [ARGUMENT_CHECKS],
    "the formatted reason": [LOSS_REASON],
}

# The release as one statement, without the FOR UPDATE read first (a bench-only sketch of
# "what would close it" in docs/benchmarks.md; the refusal's answer is read unlocked).
RELEASE_ONE_STATEMENT_BODY = """
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    WITH leased AS (
        UPDATE guardedcron.leases l
           SET locked_until = greatest(l.min_hold_until, least(l.locked_until, t)),
               released_at = coalesce(l.released_at, t)
         WHERE l.lock_name = p_lock AND l.holder = p_holder AND l.fence = p_fence AND p_fence > 0
        RETURNING l.*
    ), ended AS (
        UPDATE guardedcron.runs r SET outcome = p_outcome, finished_at = t, reason = p_reason
         WHERE r.id = (SELECT leased.run_id FROM leased) AND r.lock_name = p_lock AND r.outcome = 'running'
    )
    SELECT * INTO cur FROM leased;
    IF FOUND THEN
        RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
        RETURN;
    END IF;
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
END
"""

LOOPS_SQL = """
CREATE PROCEDURE bench_profile.cycles(acquire_sql text, release_sql text, p_lock text, calls int,
                                      first_slot bigint, INOUT micros double precision DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    token bigint;
    began timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..calls LOOP
        EXECUTE acquire_sql INTO token USING p_lock, 'h', first_slot + i;
        IF token IS NULL THEN
            RAISE EXCEPTION 'a single caller lost a call on %: the benchmark''s premise is broken', p_lock;
        END IF;
        IF release_sql <> '' THEN
            EXECUTE release_sql USING p_lock, 'h', token;
        END IF;
        COMMIT;
    END LOOP;
    micros := extract(epoch FROM clock_timestamp() - began) * 1e6 / calls;
END $$;
"""

# The token of a win; null for a loss (whose answer carries the holder's fence).
ACQUIRE = "SELECT CASE WHEN acquired THEN fence END FROM {}($1, $2, 60, 0, $3, 90, 10000)"
FLOOR_ACQUIRE = "SELECT bench_floor.acquire($1, $2, 60, true) WHERE $3 IS NOT NULL"
RELEASE = "SELECT released FROM {}($1, $2, $3, 'finished', '')"
FLOOR_RELEASE = "SELECT bench_floor.release($1, $2, $3)"
# A loss: the lease is kept by another for a day; `token` is null, the loop goes on, and
# nothing is released.
LOSSES_SQL = (
    LOOPS_SQL.replace("bench_profile.cycles", "bench_profile.losses")
    .replace(
        """        IF release_sql <> '' THEN
            EXECUTE release_sql USING p_lock, 'h', token;
        END IF;
""",
        "",
    )
    .replace(
        """        IF token IS NULL THEN
            RAISE EXCEPTION 'a single caller lost a call on %: the benchmark''s premise is broken', p_lock;
        END IF;
""",
        """        IF token IS NOT NULL THEN
            RAISE EXCEPTION 'a call for a lease held by another won on %', p_lock;
        END IF;
""",
    )
)


@dataclass(frozen=True)
class Variant:
    label: str
    acquire_sql: str
    release_sql: str


def shipped_definition(conn: Connection, function: str) -> str:
    row = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (function,)).fetchone()
    assert row is not None
    return str(row[0])


def copy_of(definition: str, function: str, name: str, cuts: list[Cut]) -> str:
    head = f"FUNCTION {function}("
    if definition.count(head) != 1:
        raise RuntimeError(f"unexpected definition of {function}")
    body = definition.replace(head, f"FUNCTION bench_profile.{name}(")
    for cut in cuts:
        body = cut(body)
    return body


def prepare(conn: Connection) -> tuple[list[Variant], list[Variant], list[Variant]]:
    """The win-path, release and loss variants, created in bench_profile."""
    conn.execute("CREATE SCHEMA bench_profile")
    conn.execute(FLOOR_SQL)
    conn.execute(LOOPS_SQL)
    conn.execute(LOSSES_SQL)
    acquire = shipped_definition(conn, "guardedcron.acquire_v2")
    release = shipped_definition(conn, "guardedcron.release_v2")
    shipped_release = RELEASE.format("guardedcron.release_v2")
    inline = inline_grant(shipped_definition(conn, "guardedcron._require_grant"))

    def acquire_variant(
        label: str, name: str, cuts: list[Cut], release_sql: str = shipped_release
    ) -> Variant:
        conn.execute(copy_of(acquire, "guardedcron.acquire_v2", name, cuts))
        return Variant(label, ACQUIRE.format(f"bench_profile.{name}"), release_sql)

    wins = [
        Variant("shipped", ACQUIRE.format("guardedcron.acquire_v2"), shipped_release),
        acquire_variant("an exact copy (the control)", "acquire_copy", []),
    ]
    for index, (label, cuts) in enumerate(ACQUIRE_PARTS.items()):
        wins.append(acquire_variant(f"without {label}", f"acquire_cut_{index}", cuts))
    wins.append(acquire_variant("the grant check inline (a candidate)", "acquire_inline_grant", [inline]))
    wins.append(
        acquire_variant(
            "retention on one win in four, 64 rows at most (a candidate)",
            "acquire_retention_one_in_four",
            RETENTION_ONE_WIN_IN_FOUR,
        )
    )
    every_cut = [cut for cuts in ACQUIRE_PARTS.values() for cut in cuts]
    wins.append(acquire_variant("without all of these", "acquire_cut_all", every_cut))
    wins.append(Variant("history only (bench_floor's acquire)", FLOOR_ACQUIRE, shipped_release))

    start = release.index("AS $function$") + len("AS $function$")
    end = release.rindex("$function$")
    conn.execute(copy_of(release, "guardedcron.release_v2", "release_copy", []))
    conn.execute(copy_of(release, "guardedcron.release_v2", "release_without_grant", [GRANT]))
    conn.execute(copy_of(release, "guardedcron.release_v2", "release_inline_grant", [inline]))
    conn.execute(
        copy_of(
            release[:start] + RELEASE_ONE_STATEMENT_BODY + release[end:],
            "guardedcron.release_v2",
            "release_one_statement",
            [],
        )
    )
    releases = [  # each after the floor's win
        Variant("shipped", FLOOR_ACQUIRE, shipped_release),
        Variant("an exact copy (the control)", FLOOR_ACQUIRE, RELEASE.format("bench_profile.release_copy")),
        Variant(
            "without the grant check", FLOOR_ACQUIRE, RELEASE.format("bench_profile.release_without_grant")
        ),
        Variant(
            "the grant check inline (a candidate)",
            FLOOR_ACQUIRE,
            RELEASE.format("bench_profile.release_inline_grant"),
        ),
        Variant(
            "one UPDATE, no FOR UPDATE read first (a candidate)",
            FLOOR_ACQUIRE,
            RELEASE.format("bench_profile.release_one_statement"),
        ),
        Variant("history only (bench_floor's release)", FLOOR_ACQUIRE, FLOOR_RELEASE),
    ]

    losses = [
        Variant("shipped", ACQUIRE.format("guardedcron.acquire_v2"), ""),
        Variant("an exact copy (the control)", ACQUIRE.format("bench_profile.acquire_copy"), ""),
    ]
    for index, (label, cuts) in enumerate(LOSS_PARTS.items()):
        losses.append(acquire_variant(f"without {label}", f"loss_cut_{index}", cuts, release_sql=""))
    losses.append(
        Variant(
            "the grant check inline (a candidate)", ACQUIRE.format("bench_profile.acquire_inline_grant"), ""
        )
    )
    losses.append(
        acquire_variant(
            "without all of these",
            "loss_cut_all",
            [cut for cuts in LOSS_PARTS.values() for cut in cuts],
            release_sql="",
        )
    )
    losses.append(Variant("history only (bench_floor's acquire, recording the loss)", FLOOR_ACQUIRE, ""))
    return wins, releases, losses


def measure(
    conn: Connection, procedure: str, variant: Variant, lock: str, calls: int, first_slot: int
) -> float:
    row = conn.execute(
        f"CALL bench_profile.{procedure}(%s, %s, %s, %s, %s)",
        (variant.acquire_sql, variant.release_sql, lock, calls, first_slot),
    ).fetchone()
    assert row is not None
    return float(row[0])


def table(title: str, unit: str, variants: list[Variant], micros: dict[str, list[float]]) -> Table:
    """Each variant's time, and what it saves: the median over rounds of the shipped
    variant's time minus this one's in the same round (paired, so a slow round counts
    against both)."""
    shipped = micros[variants[0].label]
    out = Table(title, ["variant", f"µs per {unit} (median; min-max)", "less than shipped (paired median)"])
    for variant in variants:
        values = micros[variant.label]
        saved = statistics.median(a - b for a, b in zip(shipped, values, strict=True))
        out.add(
            variant.label,
            f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})",
            "" if variant is variants[0] else f"{saved:.1f}",
        )
    return out


def run(rounds: int, calls: int) -> list[Table]:
    # Not common.durable_server: flushes only add jitter here, and pg_stat_statements
    # tracking nested statements would add a cost to each, more to the variants with more.
    with ThrowawayPostgres(durable=False) as server:
        machine = machine_line(server)
        dsn = fresh_database(server, "profile")
        with connect(dsn) as conn:
            conn.execute("SET synchronous_commit = off")
            wins, releases, losses = prepare(conn)
            conn.execute(
                "INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until,"
                " min_hold_until, generation)"
                " VALUES ('kept', 'other', 1, now(), now() + interval '1 day', now(), 1)"
            )
            # (procedure, kind, lock, variant): every win-path variant on a lock of its own.
            plan = [("cycles", "win", f"win-{i}", v) for i, v in enumerate(wins)]
            plan += [("cycles", "release", f"release-{i}", v) for i, v in enumerate(releases)]
            plan += [("losses", "loss", "kept", v) for v in losses]
            for _, _, lock, _ in plan:  # the floor never makes a lease row; acquire_v2 would make this one
                conn.execute(
                    "INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until,"
                    " min_hold_until, generation) VALUES (%s, '', 0, now(), now(), now(), 0)"
                    " ON CONFLICT (lock_name) DO NOTHING",
                    (lock,),
                )
            micros: dict[tuple[str, str], list[float]] = {(kind, v.label): [] for _, kind, _, v in plan}
            for procedure, _, lock, variant in plan:  # warm: plans, caches, the lease rows' pages
                measure(conn, procedure, variant, lock, 20, 10**9)
            for round_index in range(rounds):
                for procedure, kind, lock, variant in plan if round_index % 2 == 0 else plan[::-1]:
                    first = round_index * calls
                    micros[(kind, variant.label)].append(
                        measure(conn, procedure, variant, lock, calls, first)
                    )

    def of(kind: str) -> dict[str, list[float]]:
        return {label: values for (k, label), values in micros.items() if k == kind}

    win_table = table(
        f"A win and its release, one part of acquire_v2 cut at a time ({rounds} rounds of {calls} cycles)",
        "cycle",
        wins,
        of("win"),
    )
    win_table.notes.append(machine)
    return [
        win_table,
        table(
            "The release after the floor's win, one part of release_v2 changed at a time",
            "cycle",
            releases,
            of("release"),
        ),
        table("A loss (the lease kept by another), one part cut at a time", "loss", losses, of("loss")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args()
    for result in run(args.rounds, args.calls):
        print(result.markdown())


if __name__ == "__main__":
    main()
