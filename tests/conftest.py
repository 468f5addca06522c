"""Fixtures shared by every suite: a real, throwaway PostgreSQL server."""

from __future__ import annotations

import compileall
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from guardedcron.devenv.postgres import ThrowawayPostgres
from guardedcron.devenv.toxiproxy import Toxiproxy
from tests.support.toxiproxy import Proxied, proxy_in_front

# --- where timed checks run --------------------------------------------------------------
QUIET_MACHINE = "quiet_machine"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{QUIET_MACHINE}: times the guard itself (the seeds' 5-second check), so it runs first,"
        " before any session-wide server or control plane has started",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """The guard processes the tests start load bytecode, as in the image (compiled at build
    time), rather than compiling every module in every process: with PYTHONDONTWRITEBYTECODE
    set, as on this project's machines, Python never caches it by itself."""
    if sys.dont_write_bytecode:
        compileall.compile_dir(Path(__file__).resolve().parent.parent / "operator", quiet=1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Quiet-machine checks first; the e2e suite last, because its control planes are
    session-scoped and keep running beside every test after the first e2e test. Otherwise
    the collection order (the sort is stable)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker(QUIET_MACHINE):
            return 0
        return 2 if item.get_closest_marker("e2e") else 1

    items.sort(key=rank)


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
