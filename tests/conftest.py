"""Fixtures shared by every suite: a real, throwaway PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from guardedcron.devenv.postgres import ThrowawayPostgres


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
