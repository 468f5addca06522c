"""A private CA with its server and client certificates, and a migrated database on a
PostgreSQL that requires TLS: shared by the guard's and the operator's TLS tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

from guardedcron.guard.migrations import migrate
from guardedcron_devenv.pki import KeyPair, make_ca, make_leaf
from guardedcron_devenv.postgres import ThrowawayPostgres


@dataclass(frozen=True)
class Certificates:
    ca: KeyPair
    stranger_ca: KeyPair  # signs nothing the server shows
    server: KeyPair  # for 127.0.0.1 and localhost, signed by `ca`
    client: KeyPair  # CN=the server's superuser, signed by `ca`


def make_certificates(folder: Path) -> Certificates:
    ca = make_ca(folder, "database-ca")
    return Certificates(
        ca=ca,
        stranger_ca=make_ca(folder, "stranger-ca"),
        server=make_leaf(folder, "server", ca, "/CN=database", "serverAuth",
                         ("IP:127.0.0.1", "DNS:localhost")),
        client=make_leaf(folder, "client", ca, "/CN=guardedcron", "clientAuth"),
    )


def migrated_dsn(server: ThrowawayPostgres) -> str:
    """A fresh database with the schema; its DSN over TCP says `sslmode=verify-full`."""
    name = f"tls_{uuid.uuid4().hex[:12]}"
    server.create_database(name)
    with psycopg.connect(server.socket_conninfo(name), autocommit=True) as conn:
        migrate(conn)
    return f"{server.dsn(name)}?sslmode=verify-full"
