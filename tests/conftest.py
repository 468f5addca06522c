"""Fixtures shared by every suite: a real, throwaway PostgreSQL server, and a kubeconfig
for a cluster nobody listens on."""

from __future__ import annotations

import compileall
import json
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.suite import REPORT_ENV
from guardedcron_devenv.toxiproxy import Toxiproxy
from tests.support.faketime import remove_leftovers
from tests.support.suite_order import QUIET_MACHINE_MARKER, quiet_checks_first_e2e_last
from tests.support.tls import Certificates, make_certificates
from tests.support.toxiproxy import Proxied, proxy_in_front


# --- where timed checks run (tests/support/suite_order.py) ----------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", QUIET_MACHINE_MARKER)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The guard processes the tests start load bytecode, as in the image (compiled at build
    time), rather than compiling every module in every process: with PYTHONDONTWRITEBYTECODE
    set, as on this project's machines, Python never caches it by itself."""
    if sys.dont_write_bytecode:
        compileall.compile_dir(Path(__file__).resolve().parent.parent / "operator", quiet=1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    remove_leftovers()  # libfaketime's, from the processes the tests ran it in (tests/support/faketime.py)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    quiet_checks_first_e2e_last(items)


# --- where the suite's time goes: one line per tier at the end of every run -----------
TIER_SECONDS: dict[str, float] = {}
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = "/".join(report.nodeid.split("/")[:2]).split("::")[0]  # tests/<tier>
    TIER_SECONDS[tier] = TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIER_SECONDS:
        terminalreporter.section("time per tier (set-up, call and tear-down)")
        for tier, seconds in sorted(TIER_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.0f} s  {tier}")
    if report := os.environ.get(REPORT_ENV):  # a lane of `make test` (guardedcron_devenv.suite)
        counts = {kind: len(reports) for kind, reports in terminalreporter.stats.items()
                  if kind in OUTCOMES}
        Path(report).write_text(json.dumps({"counts": counts, "tier_seconds": TIER_SECONDS}))


@pytest.fixture(scope="session")
def postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def dsn(postgres: ThrowawayPostgres) -> str:
    """A fresh database with the guardedcron schema migrated."""
    from guardedcron.guard.migrations import migrate

    url = postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    return url


@pytest.fixture
def empty_dsn(postgres: ThrowawayPostgres) -> str:
    """A fresh database without the schema."""
    return postgres.create_database(f"e_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """A real Toxiproxy server, built from its Go module on first use (a build error fails
    the test with go's output; it is never skipped)."""
    with Toxiproxy() as server:
        yield server


@pytest.fixture(scope="session")
def pgbouncer(postgres: ThrowawayPostgres) -> Iterator[PgBouncer]:
    """A real PgBouncer (Debian's package) in transaction mode in front of the session's
    PostgreSQL; every database of it is reachable through `pgbouncer.dsn_for(dsn)`. Not
    installed or not starting: the test fails with the exact reason, it is never skipped."""
    with PgBouncer(postgres.dsn()) as pooler:
        yield pooler


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A private CA, a server certificate it signed, a client certificate it signed, and
    another CA that signed neither."""
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def client_cert_server(certificates: Certificates) -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL whose TCP logins need TLS and a client certificate signed by `certificates.ca`."""
    with ThrowawayPostgres(max_connections=20, tls=certificates.server,
                           client_ca=certificates.ca.cert) as server:
        yield server


@pytest.fixture
def proxied(dsn: str, toxiproxy: Toxiproxy) -> Iterator[Proxied]:
    """A fresh proxy in front of the test's PostgreSQL; removed (with its toxics) afterwards."""
    with proxy_in_front(toxiproxy, dsn) as pair:
        yield pair


@pytest.fixture
def proxied_empty(empty_dsn: str, toxiproxy: Toxiproxy) -> Iterator[Proxied]:
    """The same in front of a database without the schema."""
    with proxy_in_front(toxiproxy, empty_dsn) as pair:
        yield pair


@pytest.fixture
def closed_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for a cluster nobody listens on: any request would exit 69, not 64."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path
