"""Options and servers of the chaos suite.

The chaos run restarts its PostgreSQL many times, so it gets a server of its own rather
than the session's shared one. Options go with the test path, e.g.
`.venv/bin/python -m pytest tests/chaos --chaos-seed 1234` or `... tests/chaos --chaos-long`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.toxiproxy import Toxiproxy
from tests.chaos.plan import Plan, add_options, plan_from_options
from tests.chaos.schema import create_database
from tests.support.toxiproxy import Proxied, proxy_in_front


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    limit = int(plan_from_options(config).time_limit_seconds) + 120
    for item in items:  # the chaos run has its own hang guard, longer than the suite's default timeout
        if item.get_closest_marker("chaos") and item.name.startswith("test_no_double_work"):
            item.add_marker(pytest.mark.timeout(limit))


@pytest.fixture(scope="session")
def chaos_plan(pytestconfig: pytest.Config) -> Plan:
    return plan_from_options(pytestconfig)


@pytest.fixture
def restartable_postgres() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def chaos_pooler(restartable_postgres: ThrowawayPostgres) -> Iterator[PgBouncer]:
    """A real PgBouncer in transaction mode in front of the chaos run's server, for its pooled
    lane. Three server sessions for six seats, so clients really take turns; a failed server
    login (the server restarting) is retried after 0.5 s instead of 15; a client waits at most
    10 s for a server session and 5 s for a server connection to open, then gets an error."""
    settings = {"server_login_retry": "0.5", "query_wait_timeout": "10", "server_connect_timeout": "5"}
    with PgBouncer(restartable_postgres.dsn(), pool_size=3, settings=settings) as pooler:
        yield pooler


@pytest.fixture
def chaos_dsn(postgres: ThrowawayPostgres) -> str:
    """A fresh database with the guardedcron schema and the chaos tables, on the shared server."""
    return create_database(postgres, f"c_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def chaos_proxied(chaos_dsn: str, toxiproxy: Toxiproxy) -> Iterator[Proxied]:
    """A Toxiproxy in front of the chaos database: (proxy, the DSN through it)."""
    with proxy_in_front(toxiproxy, chaos_dsn) as pair:
        yield pair
