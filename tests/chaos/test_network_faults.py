"""Network faults one at a time, through a real Toxiproxy: what the chaos run's network
lanes do at random, here made certain.

The first test is the control for network faults: a writer that skips the fence check,
slowed by the network while it is taken over, must be caught as double work, or the
chaos run's zero under network faults would prove nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from tests.chaos.invariants import Findings, check_history
from tests.chaos.network import bounded_dsn
from tests.chaos.schema import enqueue
from tests.chaos.test_single_faults import admin, findings, run_outcomes, take
from tests.chaos.work import Holding, Job, Refused
from tests.support.toxiproxy import Proxied

pytestmark = pytest.mark.chaos
Connection = psycopg.Connection[tuple[Any, ...]]
HEAL_BOUND_S = 10.0  # a call held by a blackhole returns this soon after the heal, at most


def in_background(call: Callable[[], object], raised: list[BaseException]) -> threading.Thread:
    """Run `call` in a daemon thread; whatever it raises is appended to `raised`."""

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to the test to inspect
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def b_takes_over_and_does_everything(dsn: str, lease: float) -> None:
    time.sleep(lease + 0.1)  # A's lease has run out
    b_fence = take(dsn, "job", "b", 30)
    Job(dsn, Holding("job", "b", b_fence, 30), rng=random.Random(2)).run()


def slowed_while_taken_over(dsn: str, proxied: Proxied, *, fenced: bool) -> tuple[Job, list[BaseException]]:
    """A reads its first batch; then its statements to the server crawl (600 ms each) while
    B, on a direct connection, waits out A's lease, takes over and does all the work."""
    proxy = proxied.proxy
    with admin(dsn) as conn:
        enqueue(conn, "job", 4)
    a_fence = take(dsn, "job", "a", 0.3)
    taker: list[threading.Thread] = []
    raised: list[BaseException] = []  # by B's thread

    def slowed(batch: int) -> None:
        if batch == 0 and not taker:
            proxy.add_toxic("latency", "upstream", latency=600)

            def b_then_heal() -> None:
                try:
                    b_takes_over_and_does_everything(dsn, 0.3)
                finally:
                    proxy.clear()

            taker.append(in_background(b_then_heal, raised))

    job = Job(
        bounded_dsn(proxy, dsn),
        Holding("job", "a", a_fence, 0.3),
        rng=random.Random(1),
        after_read=slowed,
        fenced=fenced,
    )
    try:
        job.run()
    finally:
        job.close()
        taker[0].join(HEAL_BOUND_S)
    return job, raised


def test_the_checks_catch_an_unfenced_writer_slowed_by_the_network(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    """Nothing fences A's slowed transaction, so it runs beside B's takeover: double work, caught."""
    _, raised = slowed_while_taken_over(chaos_dsn, chaos_proxied, fenced=False)
    assert raised == []
    found = findings(chaos_dsn)
    assert found.figures["duplicates"] == 2, found.violations  # A's first batch: two items charged twice
    assert any(v.startswith("items with a step committed more than once: 2") for v in found.violations)
    # A's slowed insert held the invoice keys, so B's effects were the ones absorbed.
    assert any(v.startswith("effects absorbed by a dedupe key") for v in found.violations)


def test_the_same_slowed_writer_with_its_fence_check_is_not_overtaken(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    """With the fence check, A's open transaction holds the check's lock: B's takeover waits
    for A's (slow) commit, then B does only what is left and A's next write is refused."""
    with pytest.raises(Refused):
        slowed_while_taken_over(chaos_dsn, chaos_proxied, fenced=True)
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["duplicates"] == 0
    assert found.figures["stale_writes_refused"] == 1


def test_a_holder_partitioned_past_its_lease_is_refused_after_the_heal(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    """A silent partition (both directions) before A's second batch; B takes over and
    finishes; the heal closes A's connection; A's retried write is refused."""
    proxy, _ = chaos_proxied
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 4)
    a_fence = take(chaos_dsn, "job", "a", 0.3)

    def partitioned(batch: int) -> None:
        if batch == 1:
            assert len(proxy.blackhole()) == 2
            heal_later = threading.Timer(1.5, proxy.clear)
            heal_later.start()
            b_takes_over_and_does_everything(chaos_dsn, 0.3)

    job = Job(
        bounded_dsn(proxy, chaos_dsn), Holding("job", "a", a_fence, 0.3), rng=random.Random(1)
    )
    job.before_batch = partitioned
    with pytest.raises(Refused, match=f'stale fencing token {a_fence} for lock "job"'):
        job.run()
    job.close()
    assert job.reconnects >= 1  # the heal closed the connection the blackhole held
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["duplicates"] == 0
    assert found.figures["stale_writes_refused"] == 1
    assert run_outcomes(chaos_dsn) == [("a", "abandoned"), ("b", "running")]


def test_an_acquire_whose_answer_is_lost_holds_the_lease_until_it_runs_out(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    """Server-to-client blackhole: the acquire commits, its answer never arrives. The lease
    is held by a holder that does not know it; nobody else gets it until it runs out."""
    proxy, _ = chaos_proxied
    conn = psycopg.connect(bounded_dsn(proxy, chaos_dsn), autocommit=True)
    proxy.blackhole("downstream")
    raised: list[BaseException] = []
    call = in_background(lambda: lease_ops.acquire(conn, AcquireRequest("job", "unheard", 1.0)), raised)
    deadline = time.monotonic() + HEAL_BOUND_S
    while time.monotonic() < deadline and run_outcomes(chaos_dsn) != [("unheard", "running")]:
        time.sleep(0.02)
    assert run_outcomes(chaos_dsn) == [("unheard", "running")]  # the server acted
    assert call.is_alive()  # the caller still waits for the answer
    with admin(chaos_dsn) as direct:
        early = lease_ops.acquire(direct, AcquireRequest("job", "early", 30))
    assert (early.acquired, early.reason) == (False, "lease-held")
    proxy.clear()
    call.join(HEAL_BOUND_S)
    assert not call.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], psycopg.OperationalError)
    conn.close()
    time.sleep(1.0)
    take(chaos_dsn, "job", "later", 30)
    assert run_outcomes(chaos_dsn) == [("unheard", "abandoned"), ("early", "skipped"), ("later", "running")]


def test_an_acquire_that_never_reaches_the_server_leaves_no_trace(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    proxy, _ = chaos_proxied
    conn = psycopg.connect(bounded_dsn(proxy, chaos_dsn), autocommit=True)
    proxy.blackhole("upstream")
    raised: list[BaseException] = []
    call = in_background(lambda: lease_ops.acquire(conn, AcquireRequest("job", "lost", 30)), raised)
    call.join(1.0)
    assert call.is_alive()
    proxy.clear()
    call.join(HEAL_BOUND_S)
    assert not call.is_alive() and len(raised) == 1
    conn.close()
    assert run_outcomes(chaos_dsn) == []
    take(chaos_dsn, "job", "next", 30)  # the lease was never taken


def test_reset_connections_are_retried_and_the_work_done_once(
    chaos_dsn: str, chaos_proxied: Proxied
) -> None:
    proxy, _ = chaos_proxied
    with admin(chaos_dsn) as conn:
        enqueue(conn, "job", 6)
    fence = take(chaos_dsn, "job", "a", 30)

    def reset_for_a_moment(batch: int) -> None:
        if batch == 1:
            proxy.add_toxic("reset_peer", "downstream", timeout=0)
            threading.Timer(0.3, proxy.clear).start()

    job = Job(
        bounded_dsn(proxy, chaos_dsn),
        Holding("job", "a", fence, 30),
        rng=random.Random(3),
        before_batch=reset_for_a_moment,
    )
    job.run()
    job.close()
    assert job.reconnects >= 1
    found = findings(chaos_dsn)
    assert found.violations == []
    assert found.figures["items"] == 6 and found.figures["duplicates"] == 0


def test_the_fence_history_check_catches_a_fence_that_went_backwards(chaos_dsn: str) -> None:
    """Fences are not consecutive since schema 3; the check asks that they only grow. Its
    control: two honest grants pass, a third granted a smaller fence is reported."""
    first = take(chaos_dsn, "job", "a", 0.1)
    time.sleep(0.15)
    second = take(chaos_dsn, "job", "b", 0.1)
    assert second > first
    with admin(chaos_dsn) as conn:
        found = Findings()
        check_history(conn, found)
        assert not [v for v in found.violations if v.startswith("locks whose fences")]
        # A grant recorded after b's with a's older fence: what a fence going backwards looks like.
        conn.execute(
            "INSERT INTO guardedcron.runs (lock_name, holder, fence, started_at, outcome)"
            " VALUES ('job', 'c', %s, clock_timestamp(), 'abandoned')",
            (first,),
        )
        found = Findings()
        check_history(conn, found)
    assert [v for v in found.violations if v.startswith("locks whose fences did not only grow")]
