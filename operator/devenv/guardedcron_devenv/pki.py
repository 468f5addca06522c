"""Throwaway certificates and keys, made with the openssl CLI: for one local control
plane, and for a PostgreSQL server that speaks TLS (make_ca, make_leaf).

Each control plane gets its own CA, so two running at once never trust each other's
clients. Keys are ECDSA P-256: quick to make, and accepted by every Kubernetes component
for serving, client authentication and service-account token signing.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

VALID_DAYS: Final = 7
EC_KEY_ARGS: Final = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


class PkiError(RuntimeError):
    """openssl is missing or refused to make a certificate."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ControlPlanePki:
    ca: KeyPair
    apiserver: KeyPair  # serving certificate of kube-apiserver
    admin: KeyPair  # client certificate in group system:masters
    controller_manager: KeyPair  # client certificate of user system:kube-controller-manager
    service_account_key: Path  # signs service-account tokens (private)
    service_account_public_key: Path  # verifies them


def build_ca_command(pair: KeyPair, common_name: str) -> list[str]:
    return [
        "openssl", "req", "-x509", *EC_KEY_ARGS,
        "-keyout", str(pair.key), "-out", str(pair.cert),
        "-days", str(VALID_DAYS), "-subj", f"/CN={common_name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    ]  # fmt: skip


def build_leaf_command(
    pair: KeyPair, ca: KeyPair, subject: str, usage: str, alt_names: tuple[str, ...] = ()
) -> list[str]:
    """A certificate signed by `ca`; `usage` is serverAuth or clientAuth."""
    command = [
        "openssl", "req", "-x509", *EC_KEY_ARGS,
        "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-keyout", str(pair.key), "-out", str(pair.cert),
        "-days", str(VALID_DAYS), "-subj", subject,
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
        "-addext", f"extendedKeyUsage={usage}",
    ]  # fmt: skip
    if alt_names:
        command += ["-addext", "subjectAltName=" + ",".join(alt_names)]
    return command


def build_service_account_key_commands(private: Path, public: Path) -> list[list[str]]:
    return [
        ["openssl", "genpkey", "-algorithm", "EC",
         "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(private)],
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
    ]  # fmt: skip


# Names clients may use for the API server: loopback, and the in-cluster service names
# that tokens and kubeconfigs made for pods refer to.
APISERVER_ALT_NAMES: Final = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


def make_pki(
    folder: Path, cluster_name: str, service_ip: str, extra_ips: tuple[str, ...] = ()
) -> ControlPlanePki:
    """Write a CA, the server and client certificates, and the token signing keys."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = ControlPlanePki(
        ca=KeyPair(folder / "ca.crt", folder / "ca.key"),
        apiserver=KeyPair(folder / "apiserver.crt", folder / "apiserver.key"),
        admin=KeyPair(folder / "admin.crt", folder / "admin.key"),
        controller_manager=KeyPair(folder / "kcm.crt", folder / "kcm.key"),
        service_account_key=folder / "sa.key",
        service_account_public_key=folder / "sa.pub",
    )
    commands = [
        build_ca_command(pki.ca, f"guardedcron-{cluster_name}-ca"),
        build_leaf_command(
            pki.apiserver, pki.ca, "/CN=kube-apiserver", "serverAuth",
            (*APISERVER_ALT_NAMES, f"IP:{service_ip}",
             *(f"IP:{ip}" for ip in extra_ips if f"IP:{ip}" not in APISERVER_ALT_NAMES)),
        ),
        build_leaf_command(
            pki.admin, pki.ca, "/O=system:masters/CN=guardedcron-admin", "clientAuth"
        ),
        build_leaf_command(
            pki.controller_manager, pki.ca, "/CN=system:kube-controller-manager", "clientAuth"
        ),
        *build_service_account_key_commands(
            pki.service_account_key, pki.service_account_public_key
        ),
    ]  # fmt: skip
    _run_openssl(commands)
    return pki


def make_ca(folder: Path, name: str) -> KeyPair:
    """A CA of its own, as `<folder>/<name>.crt` and `.key`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    _run_openssl([build_ca_command(ca, name)])
    return ca


def make_leaf(
    folder: Path, name: str, ca: KeyPair, subject: str, usage: str, alt_names: tuple[str, ...] = ()
) -> KeyPair:
    """A certificate signed by `ca`, as `<folder>/<name>.crt` and `.key` (see build_leaf_command)."""
    folder.mkdir(parents=True, exist_ok=True)
    leaf = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    _run_openssl([build_leaf_command(leaf, ca, subject, usage, alt_names)])
    return leaf


def _run_openssl(commands: list[list[str]]) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("the openssl command is not on PATH; it makes the local certificates")
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise PkiError(f"{' '.join(command[:3])} failed: {result.stderr.strip()}")
