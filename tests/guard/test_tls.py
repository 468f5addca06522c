"""TLS to PostgreSQL with a private CA and client certificates (spec.lease.tls).

A real PostgreSQL with `ssl = on` and a server certificate from a CA of the test's own
(the devenv pki helper), and the real `guardedcron acquire` told where the CA, the client
certificate and its key are as the builders tell it in a pod: PGSSLROOTCERT, PGSSLCERT,
PGSSLKEY and GUARDEDCRON_TLS_KEY_SOURCE. The DSN says `sslmode=verify-full`.
"""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from guardedcron.contract import (
    ENV_TERMINATION_LOG,
    ENV_TLS_KEY_SOURCE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.support import CliResult, run_cli
from tests.support.tls import Certificates, migrated_dsn

ACQUIRE = ["acquire", "--holder", "pod-a", "--lease-seconds", "30", "--connect-timeout", "5"]


@pytest.fixture(scope="module")
def tls_server(certificates: Certificates) -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres(max_connections=20, tls=certificates.server) as server:
        yield server


@dataclass(frozen=True)
class Outcome:
    result: CliResult
    termination: str

    def everything(self) -> str:
        return self.result.stdout + self.result.stderr + self.termination


def acquire(dsn: str, env: dict[str, str], tmp_path: Path) -> Outcome:
    termination = tmp_path / f"termination-{uuid.uuid4().hex}"
    termination.write_text("")
    result = run_cli([*ACQUIRE, "--lock", f"tls/{uuid.uuid4().hex}", "--out", str(tmp_path)],
                     dsn=dsn, env={ENV_TERMINATION_LOG: str(termination), **env})
    return Outcome(result, termination.read_text())


def world_readable_key(certificates: Certificates, folder: Path) -> Path:
    """The client key as a Secret volume shows it to a non-root user: root's, mode 0644."""
    key = folder / "secret-volume" / "tls.key"
    key.parent.mkdir()
    key.write_bytes(certificates.client.key.read_bytes())
    key.chmod(0o644)
    return key


def client_env(certificates: Certificates, folder: Path) -> dict[str, str]:
    """The CA and the client certificate as the builders point libpq at them in a pod."""
    private = folder / "private"
    private.mkdir()
    return {
        "PGSSLROOTCERT": str(certificates.ca.cert),
        "PGSSLCERT": str(certificates.client.cert),
        "PGSSLKEY": str(private / "tls.key"),
        ENV_TLS_KEY_SOURCE: str(world_readable_key(certificates, folder)),
    }


def assert_refused(outcome: Outcome, *words: str, password: str) -> None:
    result = outcome.result
    assert result.code == EXIT_UNAVAILABLE, result
    reasons = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(reasons) == 1, result.stderr
    for word in words:
        assert word in reasons[0], reasons[0]
    assert "Traceback" not in result.stderr
    assert password not in outcome.everything(), outcome
    assert words[0] in json.loads(outcome.termination)["reason"], outcome.termination


def test_acquire_verifies_the_server_against_the_private_ca(
    tls_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    outcome = acquire(migrated_dsn(tls_server), {"PGSSLROOTCERT": str(certificates.ca.cert)},
                      tmp_path)
    assert outcome.result.code == 0, outcome.result
    assert outcome.result.json["acquired"] is True


def test_a_server_signed_by_another_ca_is_refused_in_one_clear_line(
    tls_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    outcome = acquire(migrated_dsn(tls_server),
                      {"PGSSLROOTCERT": str(certificates.stranger_ca.cert)}, tmp_path)
    assert_refused(outcome, "server certificate verification failed",
                   "certificate verify failed", "spec.lease.tls.caSecretRef",
                   password=tls_server.password)


def test_a_host_name_the_certificate_does_not_hold_is_refused(
    tls_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    # libpq connects to hostaddr but checks the certificate against host.
    name = migrated_dsn(tls_server).split("?")[0].rsplit("/", 1)[1]
    dsn = (f"host=db.elsewhere.example hostaddr=127.0.0.1 port={tls_server.port} dbname={name} "
           f"user={tls_server.superuser} password={tls_server.password} sslmode=verify-full")
    outcome = acquire(dsn, {"PGSSLROOTCERT": str(certificates.ca.cert)}, tmp_path)
    assert_refused(outcome, "server certificate verification failed",
                   'does not match host name "db.elsewhere.example"',
                   password=tls_server.password)


def test_a_server_requiring_client_certificates_takes_the_pods_certificate(
    client_cert_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    env = client_env(certificates, tmp_path)
    outcome = acquire(migrated_dsn(client_cert_server), env, tmp_path)
    assert outcome.result.code == 0, outcome.result
    assert outcome.result.json["acquired"] is True
    copied = Path(env["PGSSLKEY"])
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    assert copied.read_bytes() == certificates.client.key.read_bytes()


def test_without_a_client_certificate_the_server_refuses(
    client_cert_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    outcome = acquire(migrated_dsn(client_cert_server),
                      {"PGSSLROOTCERT": str(certificates.ca.cert)}, tmp_path)
    assert_refused(outcome, "connection requires a valid client certificate",
                   password=client_cert_server.password)


def test_libpq_refuses_the_secret_volumes_key_that_the_guard_copies(
    client_cert_server: ThrowawayPostgres, certificates: Certificates, tmp_path: Path
) -> None:
    """Pointed at the world-readable key itself, libpq refuses it: the copy is needed."""
    env = client_env(certificates, tmp_path)
    env["PGSSLKEY"] = env.pop(ENV_TLS_KEY_SOURCE)
    outcome = acquire(migrated_dsn(client_cert_server), env, tmp_path)
    assert_refused(outcome, "has group or world access", password=client_cert_server.password)


def test_a_key_the_guard_cannot_copy_is_bad_input(
    certificates: Certificates, tmp_path: Path
) -> None:
    env = client_env(certificates, tmp_path)
    env[ENV_TLS_KEY_SOURCE] = str(tmp_path / "no-such-volume" / "tls.key")
    outcome = acquire("postgresql://guardedcron@127.0.0.1:1/x", env, tmp_path)
    assert outcome.result.code == EXIT_USAGE, outcome.result
    assert "cannot copy the TLS client key" in outcome.result.stderr
