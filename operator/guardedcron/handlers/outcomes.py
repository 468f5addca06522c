"""Outcome recording (`GUARDEDCRON_OUTCOME_RECORDING=true`, off by default): for each run
that finished having held the lease, the operator calls the guard's
`release_v2(lock, holder, fence, outcome, reason)` in the GuardedCronJob's database.

That records `succeeded`/`failed` on the run's history row while it is still `running`
(a run without the keeper: nothing else ends it), and ends the lease early if the
finished run still holds it (`locked_until` becomes now, or the minimum hold). It never
touches someone else's lease, nor a newer generation of the same holder: release_v2
changes nothing unless `holder` and `fence` are the lease's current ones. It needs the
schema's version 3; an older schema is an `OutcomeNotRecorded` Event saying to migrate.

Every wait is bounded (docs/design.md, "Bounded waits"): the connection has libpq's
connect timeout, TCP keepalives and `tcp_user_timeout`; the whole recording ends by
RECORDING_TIMEOUT_SECONDS because each call's socket is shut down at that instant if it
has not answered (no task cancellation: psycopg would then try to cancel the query over
the network, which can itself hang for seconds).

The DSN is read from the Secret the spec names only when there is something to record,
kept in a local variable for that one connection, and never logged: messages name
`user@host:port/dbname` and are scrubbed of the password.

spec.lease.tls is honoured the same way: the CA and the client certificate and key are
read from their Secrets before connecting, written to a private temporary directory (0700,
files 0600) for that one connection only, handed to libpq as `sslrootcert`, `sslcert` and
`sslkey`, and removed afterwards, also on error. These win over the same parameters in
the DSN (libpq: explicit parameters override the conninfo string): a path in the DSN
names a file in the job's pod, which the operator does not have. (In the pod it is the
other way round: the DSN's parameters win over PGSSLROOTCERT and friends.)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardedcron.guard.connection import (
    SCHEMA_MISSING_STATES,
    check_dsn,
    connect_failure_reason,
    connection_options,
    describe,
    last_line,
    scrub,
    shut_down_socket,
)
from guardedcron.guard.errors import BadInput
from guardedcron.kube import SECRETS, ApiError, KubeClient, KubeError, NotFound
from guardedcron.spec import DatabaseTls, ParsedSpec
from guardedcron.status import EventReason, RunEvent
from guardedcron.status.outcomes import OutcomeRecord

Logger = logging.Logger | logging.LoggerAdapter[Any]
CONNECT_TIMEOUT_SECONDS = 5
# Connect plus one short call per run: a pass never waits longer than this on the database.
RECORDING_TIMEOUT_SECONDS = 15.0
APPLICATION_NAME = "guardedcron-operator"
# Per run: whether release_v2 released it, and the lease's holder otherwise.
Answers = list[tuple[bool, str | None]]


class NotRecorded(Exception):
    """Why the outcomes could not be recorded; the message holds no secret."""


async def record_outcomes(parsed: ParsedSpec | None, records: Sequence[OutcomeRecord], *,
                          namespace: str, client: KubeClient, logger: Logger) -> list[RunEvent]:
    """Record each finished run; an `OutcomeNotRecorded` Event for each that could not be."""
    if parsed is None or not records:
        return []
    try:
        dsn = await read_dsn(client, namespace, parsed)
        tls = await read_tls(client, namespace, parsed.spec.lease.tls)
        answers = await _release_all(dsn, tls, parsed.spec.lease.name, records)
    except NotRecorded as error:
        return _not_recorded(records, str(error))
    for record, (released, holder) in zip(records, answers, strict=True):
        if released:
            logger.info(f"Recorded run {record.job} as {record.outcome} in the database "
                        f"(lease of {record.holder}, fence {record.fence}, ended).")
        else:
            logger.info(f"Run {record.job} not recorded: the lease is now held by {holder or 'nobody'}, "
                        "not by the run (its history row was ended by the takeover).")
    return []


async def read_dsn(client: KubeClient, namespace: str, parsed: ParsedSpec) -> str:
    ref = parsed.spec.lease.database_secret_ref
    data = await _secret_data(client, namespace, ref.name, "spec.lease.databaseSecretRef")
    value = _secret_value(data, f"Secret {namespace}/{ref.name}", ref.key)
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise NotRecorded(f"Secret {namespace}/{ref.name} key {ref.key!r} is not UTF-8 text") from None


@dataclass(frozen=True)
class TlsMaterial:
    """spec.lease.tls's files as their Secrets hold them; never logged."""

    ca: bytes | None
    client_cert_and_key: tuple[bytes, bytes] | None  # tls.crt, tls.key


async def read_tls(client: KubeClient, namespace: str, tls: DatabaseTls | None) -> TlsMaterial | None:
    if tls is None:
        return None
    ca = None
    if tls.ca is not None:
        data = await _secret_data(client, namespace, tls.ca.name, "spec.lease.tls.caSecretRef")
        ca = _secret_value(data, f"Secret {namespace}/{tls.ca.name}", tls.ca.key)
    client_cert_and_key = None
    if tls.client_secret is not None:
        data = await _secret_data(client, namespace, tls.client_secret, "spec.lease.tls.clientCertSecretRef")
        where = f"Secret {namespace}/{tls.client_secret}"
        client_cert_and_key = (_secret_value(data, where, "tls.crt"), _secret_value(data, where, "tls.key"))
    return TlsMaterial(ca, client_cert_and_key)


async def _secret_data(client: KubeClient, namespace: str, name: str, field: str) -> dict[str, Any]:
    where = f"Secret {namespace}/{name}"
    try:
        secret = await client.get(SECRETS, namespace, name)
    except NotFound:
        raise NotRecorded(f"{where} ({field}) does not exist") from None
    except ApiError as error:
        if error.code == 403:
            raise NotRecorded(f"the operator may not read {where}: outcome recording needs `get` on "
                              "Secrets (chart value outcomeRecording.enabled=true)") from None
        raise NotRecorded(f"reading {where} failed: {error}") from None
    except KubeError as error:
        raise NotRecorded(f"reading {where} failed: {error}") from None
    data = secret.get("data")
    return data if isinstance(data, dict) else {}


def _secret_value(data: dict[str, Any], where: str, key: str) -> bytes:
    encoded = data.get(key)
    if not isinstance(encoded, str):
        raise NotRecorded(f"{where} has no key {key!r}")
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise NotRecorded(f"{where} key {key!r} is not base64-encoded") from None


@contextmanager
def tls_parameters(tls: TlsMaterial | None) -> Iterator[dict[str, str]]:
    """libpq's sslrootcert, sslcert and sslkey for one connection: files in a private
    directory that is removed afterwards, whatever the connection did."""
    if tls is None:
        yield {}
        return
    try:
        folder = Path(tempfile.mkdtemp(prefix="guardedcron-tls-"))  # mkdtemp: mode 0700
    except OSError as error:
        raise NotRecorded(f"cannot write the TLS files for libpq: {error.strerror or error}") from None
    try:
        parameters = {}
        try:
            if tls.ca is not None:
                parameters["sslrootcert"] = _private_file(folder / "ca.crt", tls.ca)
            if tls.client_cert_and_key is not None:
                cert, key = tls.client_cert_and_key
                parameters["sslcert"] = _private_file(folder / "tls.crt", cert)
                # libpq refuses a key that its group or others may read.
                parameters["sslkey"] = _private_file(folder / "tls.key", key)
        except OSError as error:
            raise NotRecorded(f"cannot write the TLS files for libpq: {error.strerror or error}") from None
        yield parameters
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _private_file(path: Path, content: bytes) -> str:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
    return str(path)


async def _release_all(dsn: str, tls: TlsMaterial | None, lock: str,
                       records: Sequence[OutcomeRecord]) -> Answers:
    loop = asyncio.get_running_loop()
    ends = loop.time() + RECORDING_TIMEOUT_SECONDS
    try:
        check_dsn(dsn)
    except BadInput as error:
        raise NotRecorded(str(error)) from None
    with tls_parameters(tls) as tls_files:
        return await _release_all_connected(dsn, tls_files, lock, records, ends)


async def _release_all_connected(dsn: str, tls_files: dict[str, str], lock: str,
                                 records: Sequence[OutcomeRecord], ends: float) -> Answers:
    # Imported here: an operator that does not record outcomes never loads the driver.
    import psycopg

    loop = asyncio.get_running_loop()
    try:
        connection = await psycopg.AsyncConnection.connect(
            dsn, application_name=APPLICATION_NAME,
            **{**connection_options(CONNECT_TIMEOUT_SECONDS), **tls_files})
    except psycopg.Error as error:
        reason = connect_failure_reason(scrub(str(error), dsn))
        raise NotRecorded(f"cannot reach database {describe(dsn)}: {reason}") from None
    # At `ends`, cut the socket: the call waiting on it fails at once, whatever the network does.
    watchdog = loop.call_at(ends, shut_down_socket, connection.fileno())
    answers = []
    try:
        async with connection:
            for record in records:
                cursor = await connection.execute(
                    "SELECT released, holder FROM guardedcron.release_v2(%s, %s, %s, %s, %s)",
                    (lock, record.holder, record.fence, record.outcome, record.reason))
                row = await cursor.fetchone()
                answers.append((bool(row and row[0]), None if row is None or row[1] is None else str(row[1])))
            watchdog.cancel()  # before the connection closes: its fd may then be reused
    except psycopg.Error as error:
        if loop.time() >= ends:
            raise NotRecorded(f"no answer from database {describe(dsn)} within "
                              f"{RECORDING_TIMEOUT_SECONDS:g} s") from None
        if error.sqlstate in SCHEMA_MISSING_STATES:
            raise NotRecorded(f"the guardedcron schema in {describe(dsn)} is missing or older than "
                              "version 3; run `guardedcron db migrate`") from None
        raise NotRecorded(f"database {describe(dsn)}: {last_line(scrub(str(error), dsn))}") from None
    finally:
        watchdog.cancel()  # no await since the close: the loop cannot have run it on a reused fd
    return answers


def _not_recorded(records: Sequence[OutcomeRecord], why: str) -> list[RunEvent]:
    return [RunEvent(EventReason.OUTCOME_NOT_RECORDED,
                     f"outcome {record.outcome} of run {record.job} not recorded in the database: {why}; "
                     "its lease ends when it runs out", subject=record.job) for record in records]
