"""The local control plane's configuration: certificates, kubeconfig and process flags."""

from __future__ import annotations

import base64
import socket
import subprocess
from pathlib import Path

import yaml

from guardedcron_devenv.controlplane import (
    CONTROLLERS,
    LOOPBACK,
    build_apiserver_args,
    build_client_cert_credentials,
    build_controller_manager_args,
    build_etcd_args,
    build_kubeconfig,
    free_port,
)
from guardedcron_devenv.pki import make_pki


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def test_pki_certificates_chain_to_the_instance_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, "t", "10.0.0.1")
    for pair in (pki.apiserver, pki.admin, pki.controller_manager):
        assert "OK" in openssl("verify", "-CAfile", str(pki.ca.cert), str(pair.cert))
    assert "O = system:masters" in openssl("x509", "-in", str(pki.admin.cert), "-noout", "-subject")
    assert "CN = system:kube-controller-manager" in openssl(
        "x509", "-in", str(pki.controller_manager.cert), "-noout", "-subject"
    )
    serving = openssl("x509", "-in", str(pki.apiserver.cert), "-noout", "-ext", "subjectAltName")
    assert "IP Address:127.0.0.1" in serving and "IP Address:10.0.0.1" in serving


def test_two_instances_get_different_cas(tmp_path: Path) -> None:
    first = make_pki(tmp_path / "a", "a", "10.0.0.1")
    second = make_pki(tmp_path / "b", "b", "10.0.0.1")
    crossed = subprocess.run(
        ["openssl", "verify", "-CAfile", str(first.ca.cert), str(second.admin.cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert crossed.returncode != 0


def test_kubeconfig_inlines_the_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, "t", "10.0.0.1")
    config = yaml.safe_load(
        build_kubeconfig(
            "https://127.0.0.1:6443", pki.ca.cert, build_client_cert_credentials(pki.admin), "t",
            "admin",
        )
    )
    assert config["current-context"] == "t"
    [cluster] = config["clusters"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    ca = base64.b64decode(cluster["cluster"]["certificate-authority-data"])
    assert ca == pki.ca.cert.read_bytes()
    [user] = config["users"]
    assert base64.b64decode(user["user"]["client-key-data"]) == pki.admin.key.read_bytes()


def test_processes_listen_on_loopback_only(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, "t", "10.0.0.1")
    etcd = build_etcd_args(Path("etcd"), tmp_path / "data", 2379, 2380, "t")
    apiserver = build_apiserver_args(
        Path("kube-apiserver"), pki, "http://127.0.0.1:2379", 6443, tmp_path
    )
    kcm = build_controller_manager_args(
        Path("kube-controller-manager"), pki, tmp_path / "kc", 10257, tmp_path
    )
    urls = [a.split("=", 1)[1] for a in etcd if a.startswith("--listen-")]
    assert urls and all(url.startswith(f"http://{LOOPBACK}:") for url in urls)
    assert f"--bind-address={LOOPBACK}" in apiserver
    assert f"--bind-address={LOOPBACK}" in kcm
    assert "--leader-elect=false" in kcm
    assert f"--controllers={','.join(CONTROLLERS)}" in kcm
    assert {"cronjob-controller", "job-controller", "garbage-collector-controller"} <= set(
        CONTROLLERS
    )


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as listener:
        listener.bind((LOOPBACK, port))
