"""Contenders and what the harness keeps of them.

- `Attempt`: the harness's record of one contender, written to `chaos.attempts` for the
  checks; `Contender`: a workload process and the files it leaves (answer, fence, progress).
- `workload_command` / `workload_env`: how a workload process is started, with clock
  skew through libfaketime preloaded (the guard it runs inherits it).
- `Link`: a connection that is reopened after a restart or a cut, with calls retried;
  `Admin`: one per harness thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from tests.chaos.work import connect, is_transient
from tests.support.faketime import skewed_env

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

ANSWERED_EXITS = (0, 75)  # the guard answered: won, or lost to a lease or a slot claim


def name_connection(name: str, conn: Connection) -> None:
    conn.execute("SELECT set_config('application_name', %s, false)", (name,))


def terminate_backend(pid: int, conn: Connection) -> tuple[Any, ...] | None:
    return conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()


@dataclass
class Attempt:
    holder: str
    path: str  # process | connection
    lock: str
    slot: int | None
    answered: bool = False
    acquired: bool = False
    reason: str | None = None
    run_id: int | None = None
    fence: int | None = None
    exit_code: int | None = None
    answer_seconds: float | None = None
    faults: list[str] = field(default_factory=list)


@dataclass
class Contender:
    """A workload process and where it leaves its traces."""

    attempt: Attempt
    proc: subprocess.Popen[bytes]
    run_dir: Path
    started: float
    ended: float | None = None

    def holds(self) -> bool:
        return (self.run_dir / "fence").exists()

    def answered(self) -> bool:
        return self.ended is not None or (self.run_dir / "answer.json").exists()

    def progress(self) -> int:
        try:
            return int((self.run_dir / "progress").read_text())
        except (OSError, ValueError):
            return -1

    def reap(self) -> bool:
        if self.ended is None and self.proc.poll() is not None:
            self.ended = time.monotonic()
        return self.ended is not None

    def finish(self) -> Attempt:
        """Fill the attempt from what the process left behind."""
        a = self.attempt
        a.exit_code = self.proc.returncode
        try:
            answer = json.loads((self.run_dir / "answer.json").read_text())
        except (OSError, ValueError):
            return a  # killed or failed before the guard answered
        a.answer_seconds = float(answer["seconds"])
        reply = answer.get("answer")
        if answer["exit"] in ANSWERED_EXITS and reply is not None:
            a.answered = True
            a.acquired = bool(reply["acquired"])
            a.reason = str(reply["reason"])
            a.run_id = reply.get("run_id")
            a.fence = reply.get("fence")
        elif answer["exit"] not in (69,):
            a.reason = f"acquire exited {answer['exit']}: {answer.get('stderr', '')[-300:]}"
        return a


class Link:
    """One connection that is reopened when a restart or a cut has broken it, and calls retried."""

    def __init__(self, dsn: str, name: str, *, pooled: bool = False) -> None:
        self.dsn = dsn
        self.name = name
        self.pooled = pooled  # through a transaction pooler (tests/chaos/work.py `connect`)
        self.conn: Connection | None = None

    def get(self) -> Connection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = connect(self.dsn, self.name, pooled=self.pooled)
        return self.conn

    def probe(self) -> Connection:
        """The connection, checked by a round trip: a restart leaves dead ones that do not know it yet."""
        try:
            self.get().execute("SELECT 1")
        except psycopg.Error:
            self.close()
        return self.get()

    def adopt(self, conn: Connection | None) -> None:
        if conn is not self.conn:
            self.close()
            self.conn = conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def run(self, action: Callable[[Connection], T], give_up_after: float = 60.0) -> T:
        deadline = time.monotonic() + give_up_after
        while True:
            conn: Connection | None = None
            try:
                conn = self.get()
                return action(conn)
            except Exception as exc:
                if not is_transient(exc, conn) or time.monotonic() > deadline:
                    raise
                self.close()
                time.sleep(0.1)


class Admin:
    """The harness's own database access: a Link per thread."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._local = threading.local()

    def run(self, action: Callable[[Connection], T], give_up_after: float = 60.0) -> T:
        link: Link | None = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = Link(self.dsn, "harness")
        return link.run(action, give_up_after)


def store_attempts(attempts: list[Attempt], conn: Connection) -> None:
    """Write the harness's own record of every contender, for the checks to join with the history."""
    rows = [
        (
            a.holder,
            a.path,
            a.lock,
            a.slot,
            a.answered,
            a.acquired,
            a.reason,
            a.run_id,
            a.fence,
            a.exit_code,
            a.answer_seconds,
            a.faults,
        )
        for a in attempts
    ]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO chaos.attempts (holder, path, lock_name, slot, answered, acquired, reason,"
            " run_id, fence, exit_code, answer_seconds, faults)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


def workload_command(
    lock: str, holder: str, slot: int | None, lease: float, run_dir: Path, *, pooled: bool = False
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "tests.chaos.workload",
        "--lock",
        lock,
        "--holder",
        holder,
        "--lease-seconds",
        str(lease),
        "--run-dir",
        str(run_dir),
        "--seed",
        str(sum(holder.encode())),
        *(["--pooled"] if pooled else []),
    ]
    return command if slot is None else [*command, "--slot", str(slot)]


def workload_env(dsn: str, skew: str | None = None) -> dict[str, str]:
    return {**skewed_env(skew), "GUARDEDCRON_DSN": dsn}
