"""The fault proxy itself: faults are real (a query through a blackhole gets no answer)
and healing works, so the partition and chaos tests built on it can be trusted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from guardedcron_devenv.toxiproxy import Proxy, ToxiproxyError
from tests.support.toxiproxy import Proxied

# libpq bounds for connections opened here. Note that a Toxiproxy blackhole is invisible
# to TCP-level bounds (tcp_user_timeout, keepalives): the proxy's kernel acknowledges every
# byte it then drops. Only a client-side deadline detects it; here the test heals the proxy.
BOUNDED = {"connect_timeout": 2, "tcp_user_timeout": 1500, "keepalives": 1}
SILENCE_S = 1.0
HEAL_BOUND_S = 10.0


def _select_one(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True, **BOUNDED) as conn:
        row = conn.execute("select 1").fetchone()
    assert row is not None
    return int(row[0])


def _in_background(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run `call` in a daemon thread; whatever it raises lands in the returned list."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to the test to inspect
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def test_a_query_through_the_proxy_reaches_postgres(proxied: Proxied) -> None:
    assert conninfo_to_dict(proxied.dsn)["port"] == str(proxied.proxy.listen_port)
    assert _select_one(proxied.dsn) == 1


def test_a_blackhole_swallows_a_live_connection_and_clear_heals(proxied: Proxied) -> None:
    with psycopg.connect(proxied.dsn, autocommit=True, **BOUNDED) as conn:
        conn.execute("select 1")
        assert len(proxied.proxy.blackhole()) == 2
        query, raised = _in_background(lambda: conn.execute("select 1"))
        query.join(SILENCE_S)
        assert query.is_alive(), "the query answered through a blackhole"
        # Healing removes the toxic, which closes the connection it held: the call returns.
        proxied.proxy.clear()
        query.join(HEAL_BOUND_S)
        assert not query.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], psycopg.OperationalError)
    assert proxied.proxy.toxic_names() == []
    assert _select_one(proxied.dsn) == 1


def test_an_upstream_blackhole_stops_a_new_connection_too(proxied: Proxied) -> None:
    proxied.proxy.blackhole("upstream")
    started = time.monotonic()
    # The startup packet is swallowed: only libpq's connect_timeout ends the attempt.
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        _select_one(proxied.dsn)
    assert time.monotonic() - started >= SILENCE_S
    proxied.proxy.clear()
    assert _select_one(proxied.dsn) == 1


def test_reset_peer_fails_the_query_at_once(proxied: Proxied) -> None:
    with psycopg.connect(proxied.dsn, autocommit=True, **BOUNDED) as conn:
        conn.execute("select 1")
        proxied.proxy.add_toxic("reset_peer", "upstream", timeout=0)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("select 1")
        assert time.monotonic() - started < 1.0


def test_disable_refuses_connections_until_enabled(proxied: Proxied) -> None:
    proxied.proxy.disable()
    with pytest.raises(psycopg.OperationalError):
        _select_one(proxied.dsn)
    proxied.proxy.enable()
    assert _select_one(proxied.dsn) == 1


def test_dsn_for_keeps_everything_but_the_address(proxied: Proxied) -> None:
    proxy: Proxy = proxied.proxy
    uri = "postgresql://jobs:s3cret@db.example:5432/app?sslmode=disable&application_name=g"
    rewritten = conninfo_to_dict(proxy.dsn_for(uri))
    assert rewritten == {
        "user": "jobs",
        "password": "s3cret",
        "host": "127.0.0.1",
        "port": str(proxy.listen_port),
        "dbname": "app",
        "sslmode": "disable",
        "application_name": "g",
    }


def test_bad_toxic_requests_are_refused_clearly(proxied: Proxied) -> None:
    with pytest.raises(ValueError, match="stream must be one of"):
        proxied.proxy.add_toxic("latency", "sideways", latency=10)
    with pytest.raises(ToxiproxyError, match="HTTP 400"):
        proxied.proxy.add_toxic("no_such_toxic")
    assert proxied.proxy.toxic_names() == []
