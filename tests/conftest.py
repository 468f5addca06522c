"""Fixtures shared by every suite: a real, throwaway PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import NamedTuple

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from guardedcron.devenv.postgres import ThrowawayPostgres
from guardedcron.devenv.toxiproxy import Proxy, Toxiproxy


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


class Proxied(NamedTuple):
    proxy: Proxy
    dsn: str  # the test's database, reached through the proxy


@pytest.fixture
def proxied(dsn: str, toxiproxy: Toxiproxy) -> Iterator[Proxied]:
    """A fresh proxy in front of the test's PostgreSQL; removed (with its toxics) afterwards."""
    params = conninfo_to_dict(dsn)
    proxy = toxiproxy.proxy(f"pg_{uuid.uuid4().hex[:12]}", f"{params['host']}:{params['port']}")
    try:
        yield Proxied(proxy, proxy.dsn_for(dsn))
    finally:
        proxy.clear()
        proxy.delete()
