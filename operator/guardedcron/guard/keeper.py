"""The keeper: renews a held lease until told to stop, then releases it.

Runs as a native sidecar next to the workload. Every lease/3 it renews. When a
renewal is refused (the fence moved on: someone took over) or no renewal is confirmed
before the lease could run out, the lease is lost: the keeper leaves a `lost` marker
for the workload and a termination message at once, then records the loss in the run
history (when it can, briefly), and exits 76 or waits, by policy. On SIGTERM
(Kubernetes sends it once the workload containers have stopped) it releases the lease,
honouring the minimum hold, and exits within KEEPER_STOP_SECONDS whatever the database does.

Timing (docs/design.md, "The keeper's timing"). The local clock only measures intervals
(monotonic); whether the lease is live is the database's answer. A renewal sent at
local time `sent` that answers (locked_until, db_now) was evaluated by the database
after `sent`, so the lease lives at least until `sent + (locked_until - db_now)` on the
local clock. The keeper gives up `margin` before that instant. Its main thread never
waits on the database: each call runs in a worker thread under a client-side deadline,
and the main thread waits for the answer, SIGTERM or its own deadline, whichever comes
first, and abandons the call at its deadline.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from guardedcron.contract import (
    EXIT_LEASE_LOST,
    EXIT_OK,
    KEEPER_STOP_SECONDS,
    KEY_FENCE,
    KEY_HOLDER,
    KEY_LOCK,
    KEY_OUTCOME,
    KEY_REASON,
    KEY_REMAINING_SECONDS,
    KEY_RENEWALS,
    KEY_SENT_MONOTONIC,
    LEASE_FILE,
    MAX_LEASE_SECONDS,
    RENEWALS_PER_LEASE,
    KeeperOutcome,
    ReleaseOutcome,
)
from guardedcron.guard import check_in as pings
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.connection import call_with_deadline, scrub
from guardedcron.guard.errors import NotPermitted, SchemaOutdated
from guardedcron.guard.outputs import write_lost_marker, write_termination_message

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

T = TypeVar("T")

# The margin before the proven end of the lease at which the keeper calls it lost: a
# fixed second (writing the marker, scheduling delays, the workload reading it) plus the
# rate difference of the two clocks over one lease (the kernel slews an NTP-disciplined
# clock by at most 500 ppm; we allow 1000). At most a quarter of the lease, so that very
# short leases (tests) still leave time to renew.
MARGIN_FIXED_SECONDS = 1.0
CLOCK_RATE_ERROR = 0.001
# After a failed (not hung) renewal, try again this much later, while the lease lasts.
RETRY_SECONDS = 1.0
# Of KEEPER_STOP_SECONDS (SIGTERM to exit, in every state), the release gets what is left
# minus the time the process needs to exit; after that the lease runs out by itself.
EXIT_RESERVE_SECONDS = 0.5
# The share of the release's time for the last renewal's connection before a new one is
# tried, and the least time worth an attempt.
REUSED_RELEASE_SHARE = 0.3
MIN_RELEASE_ATTEMPT_SECONDS = 0.5
# Recording a loss in the run history is best effort: the marker is already written.
MARK_LOST_SECONDS = 2.0
RECORD_SHARE_OF_MARGIN = 0.25


@dataclass(frozen=True)
class KeepRequest:
    dsn: str
    lock: str
    holder: str
    fence: int
    lease_seconds: float
    connect_timeout: float
    out_dir: Path | None
    exit_on_lost: bool = True


class DatabaseCall(Generic[T]):
    """One database call in a daemon thread: connect if needed, then `call` under the
    client-side deadline. The caller waits for it as long as it likes and may abandon it;
    an abandoned call ends by its own deadline and its connection is never used again."""

    def __init__(
        self,
        conn: Connection | None,
        open_connection: Callable[[], Connection],
        call: Callable[[Connection], T],
        dsn: str,
        seconds: float,
        wake: threading.Event,
    ) -> None:
        self.conn = conn
        self.value: T | None = None
        self.error: Exception | None = None
        self.done = threading.Event()
        self._open = open_connection
        self._call = call
        self._dsn = dsn
        self._seconds = seconds
        self._wake = wake
        threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        ends = time.monotonic() + self._seconds
        try:
            if self.conn is None:
                self.conn = self._open()
            self.value = call_with_deadline(self.conn, self._dsn, ends - time.monotonic(), self._call)
        except Exception as exc:  # handed over to the waiting thread
            self.error = exc
            if self.conn is not None:
                self.conn.close()  # broken or cut: never reused
                self.conn = None
        finally:
            self.done.set()
            self._wake.set()


class Keeper:
    def __init__(
        self,
        request: KeepRequest,
        connect: Callable[[str, float], Connection],
        log: Callable[[str], None],
        check_in: pings.CheckIn | None = None,
    ) -> None:
        self.request = request
        # The external check-in (spec.checkIn): pinged in threads of its own, never waited
        # on past the keeper's own bounds.
        self._check_in = check_in
        self._connect = connect
        self._log = log
        self._stop = threading.Event()
        self._stopped_at: float | None = None
        # Set by a finished call and by stop(): the main thread's one thing to wait on.
        self._wake = threading.Event()
        # The connection of the last call that answered; None after any failure.
        self._conn: Connection | None = None
        self.renewals = 0

    @property
    def interval(self) -> float:
        return self.request.lease_seconds / RENEWALS_PER_LEASE

    @property
    def margin(self) -> float:
        lease = self.request.lease_seconds
        return min(MARGIN_FIXED_SECONDS + CLOCK_RATE_ERROR * lease, lease / 4.0)

    def stop(self, *_: Any) -> None:
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()
        self._wake.set()

    def wait_for_stop(self) -> None:
        self._stop.wait()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def run(self) -> int:
        """Keep the lease until stopped; return the process exit code."""
        deadline = self._first_deadline()
        next_renewal = time.monotonic()
        last_error: str | None = None
        while True:
            if self._stop.wait(max(0.0, min(next_renewal, deadline) - time.monotonic())):
                return self._release()
            sent = time.monotonic()
            if sent >= deadline:
                # Renewals failed until now, or this process did not run in time (started
                # late, paused, starved): either way the lease can no longer be proven ours.
                why = last_error or (
                    f"the keeper ran {sent - next_renewal:.1f} s late (paused or starved)"
                    if self.renewals
                    else "its first renewal came too late (the keeper started late, paused or starved)"
                )
                return self._lost(f"could not renew before the lease could run out: {why}", deadline)
            call = self._start(self._renew, deadline - sent)
            if not self._wait(call, deadline, stop_ends_wait=True):
                if self._stop.is_set():
                    return self._release()
                return self._lost(
                    "could not renew before the lease could run out: "
                    f"no answer within {deadline - sent:.1f} s",
                    deadline,
                )
            state = self._finish(call)
            if state is None:
                assert call.error is not None
                if self.renewals == 0 and isinstance(call.error, SchemaOutdated | NotPermitted):
                    # Nothing a retry changes (schema missing, lock not granted): say so at once.
                    self._log(str(call.error))
                    return call.error.exit_code
                last_error = self._describe(call.error)
                self._log(f"renewal failed, retrying: {last_error}")
                next_renewal = time.monotonic() + RETRY_SECONDS
                continue
            if not state.ok:
                return self._lost(f"lease taken over by {state.holder} with fence {state.fence}", None)
            self.renewals += 1
            last_error = None
            deadline = sent + believed_remaining(state) - self.margin
            next_renewal = sent + self.interval

    def _first_deadline(self) -> float:
        """The deadline until a renewal answers: from the guard's acquire, when its
        lease.json (next to the lost marker, same fence) tells when it was sent and what
        the database answered; never later than counting the lease from our own start."""
        req = self.request
        own_start = time.monotonic() + req.lease_seconds - self.margin
        acquired = acquire_timing(req.out_dir / LEASE_FILE, req.fence) if req.out_dir else None
        if acquired is None:
            return own_start
        sent, remaining = acquired
        return min(own_start, sent + remaining - self.margin)

    def _renew(self, conn: Connection) -> lease_ops.LeaseState:
        req = self.request
        return lease_ops.renew(conn, req.lock, req.holder, req.fence, req.lease_seconds)

    def _start(self, call: Callable[[Connection], T], seconds: float) -> DatabaseCall[T]:
        conn, self._conn = self._conn, None  # the call owns it until it answers
        req = self.request
        return DatabaseCall(
            conn, lambda: self._connect(req.dsn, req.connect_timeout), call, req.dsn, seconds, self._wake
        )

    def _wait(self, call: DatabaseCall[T], until: float, *, stop_ends_wait: bool) -> bool:
        """Wait for `call` to end, until `until` or (if asked) SIGTERM; True if it ended."""
        while not call.done.is_set():
            if stop_ends_wait and self._stop.is_set():
                return False
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            self._wake.wait(remaining)
            self._wake.clear()
        return True

    def _finish(self, call: DatabaseCall[T]) -> T | None:
        """The answer of an ended call (its connection kept for the next), or None."""
        if call.error is not None:
            return None
        self._conn = call.conn
        return call.value

    def _describe(self, error: Exception) -> str:
        return scrub(str(error), self.request.dsn)

    def ping_start(self) -> None:
        """The check-in's start ping, in its own thread: nobody waits for it."""
        if self._check_in is not None:
            self._check_in.ping(pings.START, self._ping_body())

    def _ping_body(self) -> str:
        req = self.request
        return f"guardedcron keeper: lock {req.lock}, holder {req.holder}, fence {req.fence}"

    def _ping_until(self, what: str, until: float) -> None:
        """A check-in ping waited for until `until` at most (the exit's own bound); one
        still on its way then is abandoned with the process, and the external service's
        grace pages for it."""
        if self._check_in is None:
            return
        seconds = min(pings.PING_SECONDS, until - time.monotonic())
        if seconds < pings.MIN_ATTEMPT_SECONDS:
            self._log(f"check-in {what or 'finish'} to {self._check_in.origin} not sent: "
                      "no time left before the keeper's exit")
            return
        thread = self._check_in.ping(what, self._ping_body(), seconds=seconds)
        thread.join(seconds)
        if thread.is_alive():  # its own line would never come: the process exits now
            self._log(f"check-in {what or 'finish'} to {self._check_in.origin} not sent: "
                      f"no answer within {seconds:.1f} s, before the keeper's exit")

    def _release(self) -> int:
        code = self._release_lease()
        # Only after the release, with what the release left of its bound: the ping never
        # delays the lease's release nor the exit (KEEPER_STOP_SECONDS).
        self._ping_until(pings.FINISH, self._release_by())
        return code

    def _release_by(self) -> float:
        stopped_at = self._stopped_at if self._stopped_at is not None else time.monotonic()
        return stopped_at + KEEPER_STOP_SECONDS - EXIT_RESERVE_SECONDS

    def _release_lease(self) -> int:
        req = self.request
        by = self._release_by()

        def release(conn: Connection) -> lease_ops.LeaseState:
            return lease_ops.release(conn, req.lock, req.holder, req.fence, ReleaseOutcome.FINISHED.value,
                                     "released by the keeper after the workload stopped")

        state: lease_ops.LeaseState | None = None
        # The last renewal's connection answers in milliseconds when it is sound; a part of
        # the bound for it, then the rest on a new connection (a cut or hung one, a starved
        # first connect). A release that arrives twice is harmless: it is fenced.
        attempts = [time.monotonic() + (by - time.monotonic()) * REUSED_RELEASE_SHARE, by] \
            if self._conn is not None else [by]
        for until in attempts:
            if until - time.monotonic() < MIN_RELEASE_ATTEMPT_SECONDS:
                break
            seconds = until - time.monotonic()
            call = self._start(release, seconds)
            if not self._wait(call, until, stop_ends_wait=False):
                self._log(f"release got no answer within {seconds:.1f} s")
                continue
            state = self._finish(call)
            if state is not None:
                break
            assert call.error is not None
            self._log(f"release failed: {self._describe(call.error)}")
        if state is None:
            self._log(f"no release within {KEEPER_STOP_SECONDS:g} s of SIGTERM; the lease runs out by itself")
            return EXIT_OK
        if not state.ok:
            self._log(f"nothing to release: lease now held by {state.holder} (fence {state.fence})")
        else:
            self._log(f"released lock {req.lock} (fence {req.fence}); held until {state.locked_until}")
        write_termination_message(
            {
                KEY_OUTCOME: KeeperOutcome.RELEASED if state.ok else KeeperOutcome.NOT_HOLDER,
                KEY_LOCK: req.lock,
                KEY_HOLDER: req.holder,
                KEY_FENCE: req.fence,
                KEY_RENEWALS: self.renewals,
            }
        )
        return EXIT_OK

    def _lost(self, reason: str, deadline: float | None) -> int:
        """Report the loss; `deadline` is the one the keeper missed (None: taken over)."""
        req = self.request
        details = {KEY_LOCK: req.lock, KEY_HOLDER: req.holder, KEY_FENCE: req.fence, KEY_REASON: reason}
        # Local and instant first: the workload and Kubernetes learn of the loss even if
        # the database never answers again.
        if req.out_dir is not None:
            write_lost_marker(req.out_dir, details)
        write_termination_message({KEY_OUTCOME: KeeperOutcome.LOST, **details})
        self._log(f"LEASE LOST for lock {req.lock} (fence {req.fence}): {reason}")
        record_until = self._record_until(deadline)
        # Beside the history's record, within the same bound: the exit must still come
        # before anyone else can hold the lease.
        fail_ping = (self._check_in.ping(pings.FAIL, f"{self._ping_body()}: lease lost: {reason}",
                                         seconds=max(0.0, record_until - time.monotonic()))
                     if self._check_in is not None else None)
        call = self._start(
            lambda conn: lease_ops.mark_lost(conn, req.lock, req.holder, req.fence, reason),
            record_until - time.monotonic(),
        )
        if not self._wait(call, record_until, stop_ends_wait=True):
            self._log("could not record the loss in the run history: no answer in time")
        elif call.error is not None:
            self._log(f"could not record the loss in the run history: {self._describe(call.error)}")
        if fail_ping is not None:
            fail_ping.join(max(0.0, record_until - time.monotonic()))
        if not req.exit_on_lost:
            self.wait_for_stop()
        return EXIT_LEASE_LOST

    def _record_until(self, deadline: float | None) -> float:
        """Until when recording the loss may delay the exit. While the lease may still be
        ours (up to `deadline + margin`), the exit must come before anyone else can hold
        it: recording gets the first quarter of the margin, the rest is left for exiting
        and scheduling delays. Once the lease's end is past, a short fixed bound."""
        now = time.monotonic()
        bounded = now + MARK_LOST_SECONDS
        if deadline is None:
            return bounded
        record_by = deadline + self.margin * RECORD_SHARE_OF_MARGIN
        return min(bounded, record_by) if record_by > now else bounded


def believed_remaining(state: lease_ops.LeaseState) -> float:
    """Seconds the renewed lease still lasts, by the database's answer, never more than the
    longest lease (7 days): no renewal grants more, so a longer one ('infinity' written by
    hand reads as the year 9999) is believed only that far, and every wait stays bounded."""
    assert state.locked_until is not None  # a renewal that worked answers with its lease
    return min((state.locked_until - state.db_now).total_seconds(), float(MAX_LEASE_SECONDS))


def acquire_timing(lease_file: Path, fence: int) -> tuple[float, float] | None:
    """(sent_monotonic, remaining_seconds) that `acquire --out` wrote for this fence, if any."""
    try:
        lease = json.loads(lease_file.read_text())
        if int(lease[KEY_FENCE]) != fence:
            return None
        return float(lease[KEY_SENT_MONOTONIC]), float(lease[KEY_REMAINING_SECONDS])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent (keep --fence without acquire --out), or written by an older guard
