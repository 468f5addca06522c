"""The keeper's check-in pings (spec.checkIn), from the real `guardedcron keep` process
against the suite's PostgreSQL and a local HTTP server: what is pinged when, that a
check-in server that hangs changes neither the keeper's timing nor its exit, and that the
URL's secret part is in none of the keeper's output."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from guardedcron.contract import KEEPER_STOP_SECONDS
from tests.support import GUARDEDCRON, run_cli

SECRET = uuid.uuid4().hex  # the check's key, as in https://hc-ping.com/<uuid>


class Pings:
    """A check-in service on 127.0.0.1: records each ping's path, when it came and
    whether the lease was still live in the database then."""

    def __init__(self, dsn: str) -> None:
        self.received: list[tuple[str, float, bool]] = []
        pings = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                pings.received.append((self.path, time.monotonic(), lease_live(dsn)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/ping/{SECRET}"

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.received]

    def wait_for(self, count: int, seconds: float = 10.0) -> None:
        ends = time.monotonic() + seconds
        while len(self.received) < count and time.monotonic() < ends:
            time.sleep(0.02)


@pytest.fixture
def pings(dsn: str) -> Iterator[Pings]:
    service = Pings(dsn)
    yield service
    service.server.shutdown()


@pytest.fixture
def hanging_url() -> Iterator[str]:
    """A server that accepts connections and never answers (a hung service, a middlebox)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/ping/{SECRET}"
    stop.set()
    for conn in accepted:
        conn.close()
    listener.close()


def lease_live(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT locked_until > clock_timestamp() FROM guardedcron.leases"
                           " WHERE lock_name = 'job'").fetchone()
    return bool(row and row[0])


def acquire(dsn: str, out: Path, lease_seconds: str) -> None:
    result = run_cli(["acquire", "--lock", "job", "--holder", "a", "--lease-seconds", lease_seconds,
                      "--out", str(out)], dsn=dsn)
    assert result.code == 0, result.stderr


def start_keeper(dsn: str, out: Path, url: str | None, termination: Path,
                 lease_seconds: str = "6") -> subprocess.Popen[str]:
    termination.touch()  # Kubernetes provides the file; the keeper writes only into one
    env = {**os.environ, "GUARDEDCRON_TERMINATION_LOG": str(termination)}
    env.pop("GUARDEDCRON_CHECK_IN_URL", None)
    if url is not None:
        env["GUARDEDCRON_CHECK_IN_URL"] = url
    return subprocess.Popen(
        [GUARDEDCRON, "keep", "--lock", "job", "--holder", "a", "--fence-file", str(out / "fence"),
         "--lease-seconds", lease_seconds, "--out", str(out), "--dsn", dsn, "--check-in"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def wait_ready(keeper: subprocess.Popen[str], out: Path) -> None:
    ends = time.monotonic() + 30
    while not (out / "keeper-ready").exists():
        assert keeper.poll() is None and time.monotonic() < ends, keeper.communicate()
        time.sleep(0.01)


def stop(keeper: subprocess.Popen[str]) -> tuple[str, str, float]:
    """SIGTERM; (stdout, stderr, seconds to exit)."""
    sent = time.monotonic()
    keeper.send_signal(signal.SIGTERM)
    stdout, stderr = keeper.communicate(timeout=10)
    return stdout, stderr, time.monotonic() - sent


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text and SECRET[:8] not in text


def test_the_keeper_pings_start_then_finish_after_the_release(
        dsn: str, tmp_path: Path, pings: Pings) -> None:
    out, termination = tmp_path / "run", tmp_path / "termination-log"
    acquire(dsn, out, "6")
    keeper = start_keeper(dsn, out, pings.url, termination)
    try:
        wait_ready(keeper, out)
        pings.wait_for(1)
        assert pings.paths() == [f"/ping/{SECRET}/start"]
        assert pings.received[0][2], "start is pinged while the lease is held"
    finally:
        stdout, stderr, seconds = stop(keeper)
    assert keeper.returncode == 0, stderr
    assert seconds < KEEPER_STOP_SECONDS
    assert pings.paths() == [f"/ping/{SECRET}/start", f"/ping/{SECRET}"]
    assert pings.received[1][2] is False, "the finish ping comes after the release"
    assert "released lock job" in stderr
    assert "check-in start sent to http://127.0.0.1" in stderr
    assert "check-in finish sent to http://127.0.0.1" in stderr
    assert_no_secret(stdout, stderr, termination.read_text())


def test_a_check_in_server_that_never_answers_changes_nothing_of_the_keeper(
        dsn: str, tmp_path: Path, hanging_url: str) -> None:
    out, termination = tmp_path / "run", tmp_path / "termination-log"
    acquire(dsn, out, "3")
    keeper = start_keeper(dsn, out, hanging_url, termination, lease_seconds="3")
    try:
        wait_ready(keeper, out)
        time.sleep(4.5)  # past the acquired lease: only renewals beside a hung start ping keep it
        assert keeper.poll() is None
        assert lease_live(dsn)
    finally:
        stdout, stderr, seconds = stop(keeper)
    assert keeper.returncode == 0, stderr
    assert seconds < KEEPER_STOP_SECONDS, f"exit took {seconds:.2f} s after SIGTERM"
    assert "released lock job" in stderr
    assert not lease_live(dsn)
    assert "check-in finish to http://127.0.0.1 not sent" in stderr
    assert_no_secret(stdout, stderr, termination.read_text())


def test_a_lost_lease_pings_fail(dsn: str, tmp_path: Path, pings: Pings) -> None:
    out, termination = tmp_path / "run", tmp_path / "termination-log"
    acquire(dsn, out, "6")
    with psycopg.connect(dsn, autocommit=True) as conn:  # someone takes the lock over
        conn.execute("UPDATE guardedcron.leases SET locked_until = clock_timestamp()"
                     " WHERE lock_name = 'job'")
    assert run_cli(["acquire", "--lock", "job", "--holder", "b", "--lease-seconds", "30"],
                   dsn=dsn).code == 0
    keeper = start_keeper(dsn, out, pings.url, termination)
    stdout, stderr = keeper.communicate(timeout=15)
    assert keeper.returncode == 76, stderr
    assert f"/ping/{SECRET}/fail" in pings.paths()
    assert_no_secret(stdout, stderr, termination.read_text())


@pytest.mark.parametrize("url", [f"ftp://example.invalid/{SECRET}", f"file:///tmp/{SECRET}",
                                 f"postgresql://u:{SECRET}@h/db", f"{SECRET}"])
def test_a_check_in_url_that_is_not_http_is_refused_in_one_line_and_the_keeper_keeps(
        dsn: str, tmp_path: Path, url: str) -> None:
    out, termination = tmp_path / "run", tmp_path / "termination-log"
    acquire(dsn, out, "6")
    keeper = start_keeper(dsn, out, url, termination)
    try:
        wait_ready(keeper, out)
    finally:
        stdout, stderr, _ = stop(keeper)
    assert keeper.returncode == 0, stderr
    assert "released lock job" in stderr
    refusals = [line for line in stderr.splitlines() if "no check-in pings" in line]
    assert len(refusals) == 1, stderr
    assert "http or https" in refusals[0] or "names no host" in refusals[0]
    assert_no_secret(stdout, stderr, termination.read_text())


def test_check_in_without_its_url_says_so_once_and_the_keeper_keeps(
        dsn: str, tmp_path: Path) -> None:
    out, termination = tmp_path / "run", tmp_path / "termination-log"
    acquire(dsn, out, "6")
    keeper = start_keeper(dsn, out, None, termination)
    try:
        wait_ready(keeper, out)
    finally:
        _, stderr, _ = stop(keeper)
    assert keeper.returncode == 0, stderr
    assert stderr.count("no check-in pings") == 1, stderr
