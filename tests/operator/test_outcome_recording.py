"""Outcome recording (GUARDEDCRON_OUTCOME_RECORDING) with a real PostgreSQL and the API
emulator: a finished run's outcome reaches the history and its lease ends early; a lease
someone else holds is never touched; failures are Events that carry no password; with
spec.lease.tls, the CA and client certificate come from their Secrets, and the files
written for the connection are gone afterwards."""

from __future__ import annotations

import asyncio
import base64
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest
from guardedcron.handlers.context import PassMemory
from guardedcron.handlers.outcomes import APPLICATION_NAME, RECORDING_TIMEOUT_SECONDS
from guardedcron.kube import SECRETS, KubeClient
from guardedcron_devenv.pki import KeyPair
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.operator.passes import create_gcj, one_pass
from tests.operator.runs_support import full_pass, store_run
from tests.support import status_objects as k
from tests.support.clock import T0
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj
from tests.support.status_world import Runs
from tests.support.tls import Certificates, migrated_dsn
from tests.support.toxiproxy import Proxied

NS, NAME, LOCK = k.NAMESPACE, k.CRONJOB, f"{k.NAMESPACE}/{k.CRONJOB}"
AT = T0 - timedelta(minutes=10)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


async def secret(client: KubeClient, dsn: str, key: str = "dsn") -> None:
    await put_secret(client, "jobs-db", {key: dsn.encode()})


async def put_secret(client: KubeClient, name: str, data: dict[str, bytes]) -> None:
    await client.create(SECRETS, NS, {"apiVersion": "v1", "kind": "Secret",
                                      "metadata": {"name": name, "namespace": NS},
                                      "data": {key: base64.b64encode(value).decode()
                                               for key, value in data.items()}})


def database(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dsn, autocommit=True)


def lease_and_runs(dsn: str) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    with database(dsn) as conn:
        lease = conn.execute("SELECT holder, locked_until > clock_timestamp() FROM guardedcron.leases"
                             " WHERE lock_name = %s", (LOCK,)).fetchone()
        rows = conn.execute("SELECT holder, outcome, reason FROM guardedcron.runs WHERE lock_name = %s"
                            " ORDER BY id", (LOCK,)).fetchall()
    assert lease is not None
    return lease, rows


def not_recorded(api: GuardedEmulator) -> list[dict[str, Any]]:
    return [r.data for r in api.writes() if r.method.value == "POST" and r.url.path.endswith("/events")
            and r.data["reason"] == "OutcomeNotRecorded"]


def secret_reads(api: GuardedEmulator) -> int:
    return sum(1 for r in api.requests_list() if r.url.path.endswith("/secrets/jobs-db"))


async def test_a_finished_run_is_recorded_once_and_its_lease_ends(
        api: GuardedEmulator, client: KubeClient, runs: Runs, dsn: str) -> None:
    job, pods = runs.succeeded(AT, 1)
    with database(dsn) as conn:
        assert lease_ops.acquire(conn, AcquireRequest(LOCK, k.holder_of(job), 3600)).acquired
    await secret(client, dsn)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)
    memory = PassMemory()

    await full_pass(client, NS, NAME, now=T0, memory=memory, outcome_recording=True)

    lease, rows = lease_and_runs(dsn)
    assert lease == (k.holder_of(job), False)  # released: no longer held
    assert [(h, o) for h, o, _ in rows] == [(k.holder_of(job), "succeeded")]
    assert rows[0][2].startswith("Succeeded (reported by the operator): workload completed")
    assert not_recorded(api) == []
    reads = secret_reads(api)
    assert reads == 1

    await full_pass(client, NS, NAME, now=T0 + timedelta(seconds=5), memory=memory, outcome_recording=True)
    assert secret_reads(api) == reads  # nothing new finished: the Secret is not read again


async def test_a_lease_taken_over_is_left_to_its_holder(
        api: GuardedEmulator, client: KubeClient, runs: Runs, dsn: str) -> None:
    job, pods = runs.failed(AT, 1)
    with database(dsn) as conn:
        assert lease_ops.acquire(conn, AcquireRequest(LOCK, "eu-2/billing/other", 3600)).acquired
    await secret(client, dsn)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    lease, rows = lease_and_runs(dsn)
    assert lease == ("eu-2/billing/other", True)
    assert [(h, o) for h, o, _ in rows] == [("eu-2/billing/other", "running")]
    assert not_recorded(api) == []


async def test_off_by_default_reads_no_secret(
        api: GuardedEmulator, client: KubeClient, runs: Runs, dsn: str) -> None:
    job, pods = runs.succeeded(AT, 1)
    with database(dsn) as conn:
        lease_ops.acquire(conn, AcquireRequest(LOCK, k.holder_of(job), 3600))
    await secret(client, dsn)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory())

    assert secret_reads(api) == 0
    assert lease_and_runs(dsn)[1][0][1] == "running"


@pytest.mark.parametrize(("setup", "expected"), [
    ("no-secret", "Secret billing/jobs-db (spec.lease.databaseSecretRef) does not exist"),
    ("wrong-key", "Secret billing/jobs-db has no key 'dsn'"),
    ("unreachable", "cannot reach database guardedcron@127.0.0.1:1/nowhere: "),
])
async def test_failures_are_events_without_the_password(
        api: GuardedEmulator, client: KubeClient, runs: Runs, setup: str, expected: str) -> None:
    password = "s3cret-pw-7"
    unreachable = f"postgresql://guardedcron:{password}@127.0.0.1:1/nowhere?connect_timeout=1"
    if setup == "wrong-key":
        await secret(client, unreachable, key="url")
    elif setup == "unreachable":
        await secret(client, unreachable)
    job, pods = runs.succeeded(AT, 1)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    (event,) = not_recorded(api)
    message = event["message"]
    assert expected in message
    assert password not in message and event["type"] == "Warning"
    assert job["metadata"]["name"] in message


def operator_call_waits_on_a_lock(dsn: str) -> bool:
    """Whether the operator's call is (soon, within 10 s) waiting on a lock in the database."""
    with database(dsn) as conn:
        for _ in range(200):
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND application_name = %s AND wait_event_type = 'Lock'",
                               (APPLICATION_NAME,)).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.05)
    return False


async def test_a_database_whose_answer_never_comes_is_an_event_within_the_bound(
        api: GuardedEmulator, client: KubeClient, runs: Runs, dsn: str, proxied: Proxied) -> None:
    """The release reaches the database and waits on the lease row's lock; the network then
    swallows everything (Toxiproxy, no RST/FIN) and the lock is freed: no answer, ever."""
    job, pods = runs.succeeded(AT, 1)
    with database(dsn) as conn:
        assert lease_ops.acquire(conn, AcquireRequest(LOCK, k.holder_of(job), 3600)).acquired
    await secret(client, proxied.dsn)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)

    with psycopg.connect(dsn) as blocker:
        blocker.execute("SELECT 1 FROM guardedcron.leases WHERE lock_name = %s FOR UPDATE", (LOCK,))
        started = time.monotonic()
        recording = asyncio.create_task(
            full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True))
        assert await asyncio.to_thread(operator_call_waits_on_a_lock, dsn)
        proxied.proxy.blackhole()
        blocker.commit()
    await asyncio.wait_for(recording, 60)
    took = time.monotonic() - started

    # The stated bound, with slack for a loaded machine (not a speed claim).
    assert took < RECORDING_TIMEOUT_SECONDS + 5, took
    (event,) = not_recorded(api)
    port = proxied.proxy.listen_port
    assert f"no answer from database guardedcron@127.0.0.1:{port}/" in event["message"]
    assert f"within {RECORDING_TIMEOUT_SECONDS:g} s" in event["message"]
    password = conninfo_to_dict(dsn)["password"]
    assert password and str(password) not in event["message"]
    # The release ran in the database once the lock was freed; only its answer was lost.
    assert lease_and_runs(dsn)[1][0][1] == "succeeded"


async def test_a_schema_without_release_v2_asks_for_the_migration(
        api: GuardedEmulator, client: KubeClient, runs: Runs, dsn: str) -> None:
    job, pods = runs.succeeded(AT, 1)
    with database(dsn) as conn:
        assert lease_ops.acquire(conn, AcquireRequest(LOCK, k.holder_of(job), 3600)).acquired
        conn.execute("DROP FUNCTION guardedcron.release_v2")  # a database still on schema version 2
    await secret(client, dsn)
    await create_gcj(client, base_gcj())
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    (event,) = not_recorded(api)
    assert "is missing or older than version 3; run `guardedcron db migrate`" in event["message"]
    assert lease_and_runs(dsn)[0] == (k.holder_of(job), True)


# --- spec.lease.tls: a server with a private CA that requires client certificates -----
TLS_SPEC = {"caSecretRef": {"name": "db-ca", "key": "ca.crt"}, "clientCertSecretRef": {"name": "db-client"}}


@pytest.fixture
def tls_folders(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every temporary directory the operator makes while the test runs (the real one)."""
    made: list[Path] = []
    make = tempfile.mkdtemp

    def recording(*args: Any, **kwargs: Any) -> str:
        folder = make(*args, **kwargs)
        made.append(Path(folder))
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    return made


def tls_secrets(ca: KeyPair, client_pair: KeyPair) -> dict[str, dict[str, bytes]]:
    """TLS_SPEC's Secrets: the CA's, and the client's (kubernetes.io/tls)."""
    return {"db-ca": {"ca.crt": ca.cert.read_bytes()},
            "db-client": {"tls.crt": client_pair.cert.read_bytes(), "tls.key": client_pair.key.read_bytes()}}


async def tls_world(client: KubeClient, runs: Runs, server: ThrowawayPostgres,
                    secrets: dict[str, dict[str, bytes]]) -> tuple[dict[str, Any], str]:
    """A finished run holding the lease in a TLS server's database, its DSN (verify-full)
    and the `secrets` in the API, and a GuardedCronJob naming them in spec.lease.tls; the
    socket conninfo of that database, for the test's own look."""
    dsn = migrated_dsn(server)
    admin = server.socket_conninfo(str(conninfo_to_dict(dsn)["dbname"]))
    job, pods = runs.succeeded(AT, 1)
    with database(admin) as conn:
        assert lease_ops.acquire(conn, AcquireRequest(LOCK, k.holder_of(job), 3600)).acquired
    await secret(client, dsn)
    for name, data in secrets.items():
        await put_secret(client, name, data)
    gcj = base_gcj()
    gcj["spec"]["lease"]["tls"] = TLS_SPEC
    await create_gcj(client, gcj)
    await one_pass(client, NS, NAME, now=T0)
    await store_run(client, job, pods)
    return job, admin


async def test_over_tls_the_run_is_recorded_with_the_secrets_files_then_removed(
        api: GuardedEmulator, client: KubeClient, runs: Runs, client_cert_server: ThrowawayPostgres,
        certificates: Certificates, tls_folders: list[Path]) -> None:
    job, admin = await tls_world(client, runs, client_cert_server,
                                 tls_secrets(certificates.ca, certificates.client))

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    assert not_recorded(api) == []
    lease, rows = lease_and_runs(admin)
    assert lease == (k.holder_of(job), False)
    assert [(h, o) for h, o, _ in rows] == [(k.holder_of(job), "succeeded")]
    (folder,) = tls_folders
    assert not folder.exists()


async def test_a_server_the_ca_did_not_sign_is_an_event_naming_the_check(
        api: GuardedEmulator, client: KubeClient, runs: Runs, client_cert_server: ThrowawayPostgres,
        certificates: Certificates, tls_folders: list[Path]) -> None:
    _, admin = await tls_world(client, runs, client_cert_server,
                               tls_secrets(certificates.stranger_ca, certificates.client))

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    (event,) = not_recorded(api)
    assert "TLS: server certificate verification failed" in event["message"]
    assert "certificate verify failed" in event["message"]
    assert client_cert_server.password not in event["message"]
    assert lease_and_runs(admin)[1][0][1] == "running"
    (folder,) = tls_folders
    assert not folder.exists()


@pytest.mark.parametrize(("missing", "expected"), [
    (("db-ca", None), "Secret billing/db-ca (spec.lease.tls.caSecretRef) does not exist"),
    (("db-client", None), "Secret billing/db-client (spec.lease.tls.clientCertSecretRef) does not exist"),
    (("db-client", "tls.key"), "Secret billing/db-client has no key 'tls.key'"),
])
async def test_a_missing_tls_secret_or_key_is_an_event_naming_it(
        api: GuardedEmulator, client: KubeClient, runs: Runs, client_cert_server: ThrowawayPostgres,
        certificates: Certificates, tls_folders: list[Path], missing: tuple[str, str | None],
        expected: str) -> None:
    secrets = tls_secrets(certificates.ca, certificates.client)
    name, key = missing
    if key is None:
        del secrets[name]
    else:
        del secrets[name][key]
    _, admin = await tls_world(client, runs, client_cert_server, secrets)

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    (event,) = not_recorded(api)
    assert expected in event["message"]
    assert "BEGIN" not in event["message"]  # no certificate or key contents
    assert lease_and_runs(admin)[1][0][1] == "running"
    assert tls_folders == []  # nothing written: every Secret is read before anything else


async def test_tls_files_that_cannot_be_written_are_an_event_not_a_failed_pass(
        api: GuardedEmulator, client: KubeClient, runs: Runs, client_cert_server: ThrowawayPostgres,
        certificates: Certificates, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, admin = await tls_world(client, runs, client_cert_server,
                               tls_secrets(certificates.ca, certificates.client))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))

    await full_pass(client, NS, NAME, now=T0, memory=PassMemory(), outcome_recording=True)

    (event,) = not_recorded(api)
    assert "cannot write the TLS files for libpq: No such file or directory" in event["message"]
    assert lease_and_runs(admin)[1][0][1] == "running"
