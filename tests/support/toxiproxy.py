"""A Toxiproxy proxy in front of a test's PostgreSQL, for the suites that cut the network."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from psycopg.conninfo import conninfo_to_dict

from guardedcron_devenv.toxiproxy import Proxy, Toxiproxy


class Proxied(NamedTuple):
    proxy: Proxy
    dsn: str  # the test's database, reached through the proxy

    def __repr__(self) -> str:  # the DSN carries the password: keep it out of test reports
        return f"Proxied(proxy={self.proxy.name!r}, dsn=<through 127.0.0.1:{self.proxy.listen_port}>)"


@contextmanager
def proxy_in_front(toxiproxy: Toxiproxy, dsn: str) -> Iterator[Proxied]:
    """A fresh proxy in front of `dsn`'s server; removed (with its toxics) afterwards."""
    params = conninfo_to_dict(dsn)
    proxy = toxiproxy.proxy(f"pg_{uuid.uuid4().hex[:12]}", f"{params['host']}:{params['port']}")
    try:
        yield Proxied(proxy, proxy.dsn_for(dsn))
    finally:
        proxy.clear()
        proxy.delete()
