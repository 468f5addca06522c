"""The keeper: renews a held lease until told to stop, then releases it.

Runs as a native sidecar next to the workload. Every lease/3 it renews. When a
renewal is refused (the fence moved on: someone took over) or the database could
not be reached before the lease ran out, the lease is lost: the keeper records it
in the run history (when it can), leaves a `lost` marker for the workload, and
exits 76 or waits, by policy. On SIGTERM (Kubernetes sends it once the workload
containers have stopped) it releases the lease, honouring the minimum hold.

The local clock is only used to measure intervals (monotonic); whether the lease is
live is always the database's answer.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardedcron.contract import EXIT_LEASE_LOST, EXIT_OK
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.errors import DatabaseUnavailable
from guardedcron.guard.outputs import write_lost_marker, write_termination_message

if TYPE_CHECKING:
    import psycopg

# Do not wait for the last possible instant before calling a lease lost.
SAFETY_MARGIN_SECONDS = 1.0
RETRY_SECONDS = 1.0


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


class Keeper:
    def __init__(
        self,
        request: KeepRequest,
        connect: Callable[[str, float], psycopg.Connection[tuple[Any, ...]]],
        log: Callable[[str], None],
    ) -> None:
        self.request = request
        self._connect = connect
        self._log = log
        self._stop = threading.Event()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.renewals = 0

    @property
    def interval(self) -> float:
        return max(self.request.lease_seconds / 3.0, 0.2)

    def stop(self, *_: Any) -> None:
        self._stop.set()

    def wait_for_stop(self) -> None:
        self._stop.wait()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self.request.dsn, self.request.connect_timeout)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def run(self) -> int:
        """Keep the lease until stopped; return the process exit code."""
        req = self.request
        # Until the first renewal answers, assume only what the guard was given.
        deadline = time.monotonic() + req.lease_seconds - SAFETY_MARGIN_SECONDS
        next_renewal = time.monotonic()
        while not self._stop.is_set():
            wait = next_renewal - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            try:
                state = lease_ops.renew(
                    self._connection(), req.lock, req.holder, req.fence, req.lease_seconds
                )
            except (DatabaseUnavailable, OSError, _psycopg_error()) as exc:
                self._drop_connection()
                if time.monotonic() >= deadline:
                    return self._lost(f"could not renew before the lease ran out: {exc}")
                self._log(f"renewal failed, retrying: {exc}")
                next_renewal = time.monotonic() + RETRY_SECONDS
                continue
            if not state.ok:
                return self._lost(f"lease taken over by {state.holder} with fence {state.fence}")
            self.renewals += 1
            remaining = (state.locked_until - state.db_now).total_seconds()  # type: ignore[operator]
            deadline = time.monotonic() + remaining - SAFETY_MARGIN_SECONDS
            next_renewal = time.monotonic() + self.interval
        return self._release()

    def _release(self) -> int:
        req = self.request
        try:
            state = lease_ops.release(
                self._connection(),
                req.lock,
                req.holder,
                req.fence,
                "finished",
                "released by the keeper after the workload stopped",
            )
        except Exception as exc:
            self._log(f"release failed; the lease runs out by itself: {exc}")
            return EXIT_OK
        if not state.ok:
            self._log(f"nothing to release: lease now held by {state.holder} (fence {state.fence})")
        else:
            self._log(f"released lock {req.lock} (fence {req.fence}); held until {state.locked_until}")
        write_termination_message(
            {
                "outcome": "released" if state.ok else "not-holder",
                "lock": req.lock,
                "holder": req.holder,
                "fence": req.fence,
                "renewals": self.renewals,
            }
        )
        return EXIT_OK

    def _lost(self, reason: str) -> int:
        req = self.request
        self._log(f"LEASE LOST for lock {req.lock} (fence {req.fence}): {reason}")
        try:
            lease_ops.mark_lost(self._connection(), req.lock, req.holder, req.fence, reason)
        except Exception as exc:
            self._log(f"could not record the loss in the run history: {exc}")
        details = {"lock": req.lock, "holder": req.holder, "fence": req.fence, "reason": reason}
        if req.out_dir is not None:
            write_lost_marker(req.out_dir, details)
        write_termination_message({"outcome": "lost", **details})
        if not req.exit_on_lost:
            self.wait_for_stop()
        return EXIT_LEASE_LOST


def _psycopg_error() -> type[Exception]:
    import psycopg

    return psycopg.Error
