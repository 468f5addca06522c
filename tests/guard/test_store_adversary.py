"""The store against an adversary: hand-edited tables, reused holder ids, odd fences,
other isolation levels, callers' transactions. Real PostgreSQL; each test is a hole
found in schema version 2 (issue 10) and fails there."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from guardedcron.contract import BIGINT_MAX
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.errors import BadInput, FenceExhausted
from guardedcron.guard.lease import AcquireRequest
from tests.support import run_cli

Connection = psycopg.Connection[tuple[Any, ...]]
STALE = "GC001"


def connect(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True)


def expire(conn: Connection, lock: str) -> None:
    conn.execute(
        "UPDATE guardedcron.leases SET locked_until = clock_timestamp() - interval '1 ms',"
        " min_hold_until = clock_timestamp() - interval '1 ms' WHERE lock_name = %s",
        (lock,),
    )


def fence_check_state(conn: Connection, lock: str, fence: int | None) -> str | None:
    """The SQLSTATE check_fence raises for `fence`, or None when it passes."""
    try:
        with conn.transaction():
            conn.execute("SELECT guardedcron.check_fence(%s, %s)", (lock, fence))
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def take_generations(conn: Connection, lock: str, count: int) -> list[int]:
    fences = []
    for index in range(count):
        result = lease_ops.acquire(conn, AcquireRequest(lock, f"gen-{index}", 60, slot=100 + index))
        assert result.acquired, result
        fences.append(result.fence)
        expire(conn, lock)
    return fences


# --- hole 2: fences must only grow, whatever happens to the tables ---------------------------
def test_deleting_the_lease_row_does_not_bring_old_fences_back(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = take_generations(conn, "job", 5)
        conn.execute("DELETE FROM guardedcron.leases WHERE lock_name = 'job'")
        after = lease_ops.acquire(conn, AcquireRequest("job", "next", 60))
        assert after.acquired and after.fence > max(fences)
        for old in fences:
            assert fence_check_state(conn, "job", old) == STALE
        assert fence_check_state(conn, "job", after.fence) is None


def test_truncating_every_table_does_not_bring_old_fences_back(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = take_generations(conn, "job", 3)
        conn.execute("TRUNCATE guardedcron.leases, guardedcron.runs, guardedcron.slot_claims")
        after = lease_ops.acquire(conn, AcquireRequest("job", "next", 60))
        assert after.acquired and after.fence > max(fences)
        assert fence_check_state(conn, "job", fences[0]) == STALE


def test_the_placeholder_a_refused_first_attempt_leaves_passes_no_fence_check(dsn: str) -> None:
    with connect(dsn) as conn:
        take_generations(conn, "job", 1)  # slot 100 claimed
        conn.execute("DELETE FROM guardedcron.leases WHERE lock_name = 'job'")
        refused = lease_ops.acquire(conn, AcquireRequest("job", "late", 60, slot=100))
        assert (refused.acquired, refused.reason) == (False, "slot-claimed")
        placeholder = conn.execute(
            "SELECT holder, fence FROM guardedcron.leases WHERE lock_name = 'job'"
        ).fetchone()
        assert placeholder == ("", 0)
        assert fence_check_state(conn, "job", 0) == STALE


def test_a_restored_older_lease_row_neither_reissues_nor_revives_a_fence(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = take_generations(conn, "job", 3)
        # An older copy of the row is written back, e.g. from a backup of that table.
        conn.execute(
            "UPDATE guardedcron.leases SET holder = 'gen-0', fence = %s, locked_until = 'infinity'"
            " WHERE lock_name = 'job'",
            (fences[0],),
        )
        assert fence_check_state(conn, "job", fences[0]) == STALE
        conn.execute("UPDATE guardedcron.leases SET locked_until = clock_timestamp() WHERE lock_name = 'job'")
        after = lease_ops.acquire(conn, AcquireRequest("job", "next", 60))
        assert after.acquired and after.fence > max(fences)


def test_a_sequence_set_back_by_hand_still_gives_a_greater_fence(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = take_generations(conn, "job", 3)
        conn.execute("SELECT setval('guardedcron.fences', 1)")
        after = lease_ops.acquire(conn, AcquireRequest("job", "next", 60))
        assert after.acquired and after.fence == max(fences) + 1


def test_a_fence_at_the_bigint_maximum_is_a_clear_error_never_a_wrap(dsn: str) -> None:
    with connect(dsn) as conn:
        take_generations(conn, "job", 1)
        conn.execute("UPDATE guardedcron.leases SET fence = %s WHERE lock_name = 'job'", (BIGINT_MAX,))
        with pytest.raises(FenceExhausted, match='no fencing token is left for lock "job"'):
            lease_ops.acquire(conn, AcquireRequest("job", "next", 60))
        row = conn.execute("SELECT fence FROM guardedcron.leases WHERE lock_name = 'job'").fetchone()
        assert row == (BIGINT_MAX,)
    cli = run_cli(["acquire", "--lock", "job", "--holder", "cli", "--lease-seconds", "60"], dsn=dsn)
    assert cli.code == 78, cli
    assert "no fencing token is left" in cli.stderr and "Traceback" not in cli.stderr


# --- hole 3: NULL, zero and negative fences --------------------------------------------------
@pytest.mark.parametrize("fence", [None, 0, -1, -BIGINT_MAX])
def test_check_fence_refuses_null_zero_and_negative_fences(dsn: str, fence: int | None) -> None:
    with connect(dsn) as conn:
        take_generations(conn, "job", 1)
        assert fence_check_state(conn, "job", fence) == STALE


@pytest.mark.parametrize("fence", [None, 0, -1])
def test_renew_and_release_refuse_null_zero_and_negative_fences(dsn: str, fence: int | None) -> None:
    with connect(dsn) as conn:
        # A placeholder row (fence 0, holder '') is the one such a fence could match.
        conn.execute(
            "INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until,"
            " min_hold_until) VALUES ('job', '', 0, now(), now(), now())"
        )
        renewed = conn.execute("SELECT renewed FROM guardedcron.renew_v2('job', '', %s, 60)", (fence,))
        assert renewed.fetchone() == (False,)
        released = conn.execute(
            "SELECT released FROM guardedcron.release_v2('job', '', %s, 'finished', '')", (fence,)
        )
        assert released.fetchone() == (False,)
    with pytest.raises(BadInput, match="fence must be an integer from 1"):
        lease_ops.renew(conn, "job", "a", 0, 60)


# --- hole 4: a reused holder id asking for another slot ----------------------------------------
def test_the_same_holder_asking_for_another_slot_is_not_a_retry(dsn: str) -> None:
    with connect(dsn) as conn:
        first = lease_ops.acquire(conn, AcquireRequest("job", "A", 60, slot=100))
        assert first.acquired
        retry = lease_ops.acquire(conn, AcquireRequest("job", "A", 60, slot=100))
        assert (retry.acquired, retry.reason, retry.fence) == (True, "already-held", first.fence)
        other_slot = lease_ops.acquire(conn, AcquireRequest("job", "A", 60, slot=101))
        assert (other_slot.acquired, other_slot.reason) == (False, "lease-held")
        manual = lease_ops.acquire(conn, AcquireRequest("job", "A", 60))
        assert (manual.acquired, manual.reason) == (False, "lease-held")
        expire(conn, "job")
        later = lease_ops.acquire(conn, AcquireRequest("job", "B", 60, slot=101))
        assert later.acquired
        runs_of_101 = conn.execute(
            "SELECT count(*) FROM guardedcron.runs WHERE lock_name = 'job' AND slot = 101"
            " AND outcome <> 'skipped'"
        ).fetchone()
        assert runs_of_101 == (1,)


def test_the_cli_answers_a_reused_holder_for_another_slot_with_a_skip(dsn: str) -> None:
    base = ["acquire", "--lock", "job", "--holder", "A", "--lease-seconds", "60"]
    assert run_cli([*base, "--slot", "100"], dsn=dsn).code == 0
    again = run_cli([*base, "--slot", "101"], dsn=dsn)
    assert again.code == 75 and again.json["reason"] == "lease-held", again


# --- hole 5: release and renew of an older generation with a reused holder id ---------------
def test_a_stale_process_reusing_the_holder_id_cannot_end_the_newer_lease(dsn: str) -> None:
    with connect(dsn) as conn:
        old = lease_ops.acquire(conn, AcquireRequest("job", "H", 60))
        expire(conn, "job")
        new = lease_ops.acquire(conn, AcquireRequest("job", "H", 60))
        assert new.acquired and new.fence > old.fence
        stale_release = lease_ops.release(conn, "job", "H", old.fence, "succeeded")
        assert not stale_release.ok and stale_release.fence == new.fence
        stale_renew = lease_ops.renew(conn, "job", "H", old.fence, 600)
        assert not stale_renew.ok
        held = conn.execute(
            "SELECT fence, locked_until > clock_timestamp() + interval '50 s' FROM guardedcron.leases"
            " WHERE lock_name = 'job'"
        ).fetchone()
        assert held == (new.fence, True)
        running = conn.execute("SELECT outcome FROM guardedcron.runs WHERE id = %s", (new.run_id,)).fetchone()
        assert running == ("running",)
    cli = run_cli(["release", "--lock", "job", "--holder", "H", "--fence", str(old.fence)], dsn=dsn)
    assert cli.code == 75 and cli.json["released"] is False


# --- hole 6: other default isolation levels ------------------------------------------------------
def race_once(
    dsn: str, isolation: str, racers: int, slot: int
) -> list[lease_ops.AcquireResult | BaseException]:
    """`racers` connections call acquire for one slot at the same instant."""
    barrier = threading.Barrier(racers)
    results: list[lease_ops.AcquireResult | BaseException] = []

    def race(index: int) -> None:
        try:
            with connect(dsn) as own:
                assert own.execute("SHOW transaction_isolation").fetchone() == (isolation,)
                barrier.wait()
                results.append(lease_ops.acquire(own, AcquireRequest("race", f"r{index}", 60, slot=slot)))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_racers_under_a_stricter_default_isolation_get_one_winner_and_skips(dsn: str, isolation: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET default_transaction_isolation = '{isolation}'")
    racers, rounds = 8, 3
    for round_index in range(rounds):
        results = race_once(dsn, isolation, racers, slot=5000 + round_index)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        answers = [r for r in results if isinstance(r, lease_ops.AcquireResult)]
        assert len(answers) == racers
        assert sum(a.acquired for a in answers) == 1, answers
        with connect(dsn) as conn:
            expire(conn, "race")
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT outcome, count(*) FROM guardedcron.runs WHERE lock_name = 'race' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert sum(n for outcome, n in rows if outcome != "skipped") == rounds
    # Every loser left its row, unless its skip record itself lost a serialization race.
    assert sum(n for outcome, n in rows if outcome == "skipped") >= rounds * (racers - 2)


def test_cli_losers_under_serializable_exit_75_not_69(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET default_transaction_isolation = 'serializable'")
    import subprocess

    from tests.support import GUARDEDCRON

    env = {"GUARDEDCRON_DSN": dsn, "PATH": "/usr/bin:/bin"}
    command = [GUARDEDCRON, "acquire", "--lock", "cli-race", "--lease-seconds", "60", "--slot", "9"]
    procs = [
        subprocess.Popen(
            [*command, "--holder", f"p{i}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in range(6)
    ]
    codes = sorted(p.wait(60) for p in procs)
    assert codes == [0, 75, 75, 75, 75, 75], [p.stderr.read() for p in procs if p.stderr]


# --- hole 9: a caller's transaction ------------------------------------------------------------
def test_the_library_refuses_to_acquire_inside_an_open_transaction(dsn: str) -> None:
    with psycopg.connect(dsn) as conn, pytest.raises(BadInput, match="autocommit"):  # not autocommit
        lease_ops.acquire(conn, AcquireRequest("job", "A", 60))
    with connect(dsn) as conn, conn.transaction(), pytest.raises(BadInput, match="outside any transaction"):
        lease_ops.acquire(conn, AcquireRequest("job", "A", 60))


def test_a_rolled_back_acquisition_never_lets_its_fence_be_handed_out_again(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:  # another client calling the function inside its transaction
        row = conn.execute(
            "SELECT acquired, fence FROM guardedcron.acquire_v2('job', 'A', 60, 0, NULL, 90, 10000)"
        ).fetchone()
        assert row is not None and row[0] is True
        rolled_back_fence = row[1]
        conn.rollback()
    with connect(dsn) as conn:
        later = lease_ops.acquire(conn, AcquireRequest("job", "B", 60))
        assert later.acquired and later.fence != rolled_back_fence and later.fence > rolled_back_fence


# --- guards already deployed keep working, with the new protection --------------------------
def test_v1_functions_still_answer_and_draw_fences_from_the_sequence(dsn: str) -> None:
    with connect(dsn) as conn:
        fences = take_generations(conn, "job", 2)
        conn.execute("DELETE FROM guardedcron.leases WHERE lock_name = 'job'")
        row = conn.execute(
            "SELECT acquired, fence FROM guardedcron.acquire_v1('job', 'old-guard', 60, 0, 7, 90, 10000)"
        ).fetchone()
        assert row is not None and row[0] is True and row[1] > max(fences)
        renewed = conn.execute(
            "SELECT renewed FROM guardedcron.renew_v1('job', 'old-guard', %s, 60)", (row[1],)
        )
        assert renewed.fetchone() == (True,)
        released = conn.execute(
            "SELECT released FROM guardedcron.release_v1('job', 'old-guard', 'finished', '')"
        )
        assert released.fetchone() == (True,)


def test_the_sql_functions_refuse_leases_out_of_bounds_from_any_client(dsn: str) -> None:
    with connect(dsn) as conn:
        for seconds in (1e-7, 604_801, float("nan")):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"between 0\.1 and 604800"):
                conn.execute(
                    "SELECT * FROM guardedcron.acquire_v2('job', 'A', %s, 0, NULL, 90, 10000)", (seconds,)
                )
        count = conn.execute("SELECT count(*) FROM guardedcron.runs").fetchone()
        assert count == (0,)


def test_renew_release_and_mark_lost_work_under_serializable(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET default_transaction_isolation = 'serializable'")
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "A", 60))
        assert lease_ops.renew(conn, "job", "A", held.fence, 120).ok
        assert lease_ops.mark_lost(conn, "job", "A", held.fence, "test") is True
        assert lease_ops.release(conn, "job", "A", held.fence, "failed").ok


# --- an ended generation stays ended ------------------------------------------------------------
def test_a_renewal_that_arrives_after_the_release_does_not_revive_the_lease(dsn: str) -> None:
    """The keeper releases on SIGTERM while its last renewal may still be in flight."""
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "A", 60))
        assert lease_ops.release(conn, "job", "A", held.fence, "finished").ok
        late = lease_ops.renew(conn, "job", "A", held.fence, 60)
        assert not late.ok
        free = conn.execute(
            "SELECT locked_until <= clock_timestamp() FROM guardedcron.leases WHERE lock_name = 'job'"
        ).fetchone()
        assert free == (True,)
        assert lease_ops.acquire(conn, AcquireRequest("job", "B", 60)).acquired


def test_the_same_holder_and_slot_after_its_release_is_not_a_retry(dsn: str) -> None:
    """Within the minimum hold the released lease still lives; asking again for the slot
    it ran is a second run of that slot, not a retried call."""
    with connect(dsn) as conn:
        held = lease_ops.acquire(conn, AcquireRequest("job", "A", 60, min_hold_seconds=30, slot=7))
        assert lease_ops.release(conn, "job", "A", held.fence, "succeeded").ok
        again = lease_ops.acquire(conn, AcquireRequest("job", "A", 60, slot=7))
        assert (again.acquired, again.reason) == (False, "slot-claimed")
        old_guard = conn.execute(
            "SELECT released FROM guardedcron.release_v1('job', 'A', 'finished', '')"
        ).fetchone()
        assert old_guard == (True,)  # release_v1 (holder only) still answers for deployed keepers
