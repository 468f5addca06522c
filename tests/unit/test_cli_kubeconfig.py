"""The CLI's logins through the official client's loader, short of an API server:
what an exec plugin or an OIDC id-token gives, and how a login that cannot be had
ends (one line, the right exit code, no credential, within its bound).

The real API server sees these logins in tests/e2e/test_cli_logins.py.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.cli.kubeconfig import ENV_LOGIN_TIMEOUT, KubeconfigError, connection_info, context_namespace
from guardedcron_devenv.pki import KeyPair, build_ca_command, build_leaf_command

GUARDEDCRON = str(Path(sys.executable).parent / "guardedcron")
EXEC_API = "client.authentication.k8s.io/v1"
SERVER = "https://127.0.0.1:6443"


def kubeconfig(path: Path, user: dict[str, Any], namespace: str | None = "team-a") -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "main",
        "clusters": [{"name": "c", "cluster": {"server": SERVER}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": context},
                     {"name": "other", "context": {**context, "namespace": "team-b"}}],
    }))
    return path


def exec_user(script: Path, body: str) -> dict[str, Any]:
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return {"exec": {"apiVersion": EXEC_API, "command": str(script), "interactiveMode": "Never"}}


def trigger(config: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GUARDEDCRON, "trigger", "nightly", "--kubeconfig", str(config), *extra],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=60, check=False)


def test_an_exec_plugins_token_and_the_contexts_namespace(tmp_path: Path) -> None:
    credential = {"apiVersion": EXEC_API, "kind": "ExecCredential", "status": {"token": "from-plugin"}}
    plugin = exec_user(tmp_path / "login.sh", f"echo '{json.dumps(credential)}'")
    config = kubeconfig(tmp_path / "config", plugin)
    info = connection_info(str(config))
    assert (info.server, info.scheme, info.token, info.default_namespace) == (
        SERVER, "Bearer", "from-plugin", "team-a")
    assert connection_info(str(config), "other").default_namespace == "team-b"
    # Reading the namespace alone runs no plugin.
    (tmp_path / "login.sh").write_text("#!/bin/sh\nexit 1\n")
    assert context_namespace(str(config), "other") == "team-b"
    with pytest.raises(KubeconfigError, match="no context named 'absent'"):
        context_namespace(str(config), "absent")


def test_an_oidc_id_token_is_sent_as_the_bearer_token(tmp_path: Path) -> None:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    id_token = ".".join([part({"alg": "none"}), part({"sub": "ada", "exp": int(time.time()) + 3600}), "sig"])
    config = kubeconfig(tmp_path / "config", {"auth-provider": {"name": "oidc", "config": {
        "id-token": id_token, "client-id": "kubectl", "idp-issuer-url": "https://issuer.invalid"}}})
    info = connection_info(str(config))
    assert (info.scheme, info.token) == ("Bearer", id_token)


def test_a_plugin_that_never_answers_ends_the_command_at_the_bound(tmp_path: Path) -> None:
    pid_file = tmp_path / "plugin.pid"
    plugin = exec_user(tmp_path / "login.sh", f"echo $$ > {pid_file}\nexec sleep 300")
    config = kubeconfig(tmp_path / "config", plugin)
    try:
        result = trigger(config, **{ENV_LOGIN_TIMEOUT: "1"})
    finally:
        if pid_file.exists():  # the plugin is left running by the loader: end it here
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert result.returncode == contract.EXIT_UNAVAILABLE, result.stderr
    assert result.stderr.splitlines() == [
        "guardedcron trigger: logging in with the kubeconfig's user did not finish within 1 s (an exec "
        f"credential plugin waiting for input or its network?); ${ENV_LOGIN_TIMEOUT} sets the bound"]


@pytest.mark.parametrize(("value", "shown"), [("soon", "'soon'"), ("0", "'0'"), ("nan", "'nan'")])
def test_a_bad_login_bound_is_refused(tmp_path: Path, value: str, shown: str) -> None:
    config = kubeconfig(tmp_path / "config", {"token": "t"})
    result = trigger(config, **{ENV_LOGIN_TIMEOUT: value})
    assert result.returncode == contract.EXIT_USAGE
    assert result.stderr == (f"guardedcron trigger: ${ENV_LOGIN_TIMEOUT} must be a number of seconds "
                             f"from 0 to 86400, not {shown}\n")


def test_kubeconfig_mistakes_are_one_line_without_the_secret(tmp_path: Path) -> None:
    secret = "s3cr3t-token-value-that-must-not-show"
    broken = tmp_path / "broken"
    broken.write_text(f"users:\n- name: u\n  user: {{token: {secret}\n")  # unclosed flow mapping
    result = trigger(broken)
    assert result.returncode == contract.EXIT_USAGE
    assert result.stderr.startswith("guardedcron trigger: the kubeconfig is not valid YAML at line ")
    assert secret not in result.stderr and len(result.stderr.splitlines()) == 1

    config = kubeconfig(tmp_path / "config", {"token": secret})
    missing_context = trigger(config, "--context", "nowhere")
    assert missing_context.returncode == contract.EXIT_USAGE
    assert missing_context.stderr == "guardedcron trigger: the kubeconfig has no context named 'nowhere'\n"

    absent = trigger(tmp_path / "absent")
    assert absent.returncode == contract.EXIT_USAGE
    assert absent.stderr.startswith(f"guardedcron trigger: no kubeconfig at {tmp_path / 'absent'}")


@pytest.mark.parametrize("text", ["hi", "[1, 2]", "clusters: 5",
                                  "current-context: c\ncontexts: [{name: c, context: 7}]"])
def test_a_kubeconfig_of_the_wrong_shape_is_one_line_saying_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config"
    path.write_text(text + "\n")
    result = trigger(path)
    assert result.returncode == contract.EXIT_USAGE, result
    assert result.stderr.startswith("guardedcron trigger: the kubeconfig is not shaped like one (a YAML "
                                    "mapping with clusters, users and contexts lists): ")
    assert len(result.stderr.splitlines()) == 1


# Root reads any file: the command runs without the two capabilities that let it, so
# the kernel refuses it as it refuses any other user.
AS_A_USER = (["setpriv", "--inh-caps=-dac_override,-dac_read_search",
              "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("command", [["guardedcron", "trigger", "nightly"], ["kubectl-gcj", "runs"],
                                     ["kubectl-gcj", "render", "-f", os.devnull]],
                         ids=["trigger", "kubectl gcj runs", "kubectl gcj render"])
def test_a_kubeconfig_this_user_may_not_read_is_one_line_naming_it(
        tmp_path: Path, command: list[str]) -> None:
    unreadable = kubeconfig(tmp_path / "unreadable", {"token": "t"})
    unreadable.chmod(0)
    shut = tmp_path / "shut"
    shut.mkdir()
    behind = kubeconfig(shut / "config", {"token": "t"})
    shut.chmod(0)
    prog = " ".join(command[:2]).replace("kubectl-gcj", "kubectl gcj")
    try:
        merged = {"KUBECONFIG": f"{tmp_path}/absent:{behind}"}  # the first file is skipped, as kubectl does
        for path, env in ((unreadable, {}), (behind, {}), (None, merged)):
            flags = [] if path is None else ["--kubeconfig", str(path)]
            executable = str(Path(GUARDEDCRON).parent / command[0])
            result = subprocess.run([*AS_A_USER, executable, *command[1:], *flags], capture_output=True,
                                    text=True, env={**os.environ, **env}, timeout=60, check=False)
            assert result.returncode == contract.EXIT_USAGE, result
            assert result.stderr == (f"{prog}: cannot read the kubeconfig {path or behind}: permission "
                                     "denied for this user (set --kubeconfig or $KUBECONFIG to one it can "
                                     "read)\n"), result
    finally:
        shut.chmod(0o700)


def test_in_a_pod_without_a_kubeconfig_the_service_account_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The service account's files live at fixed paths in a pod; here they are moved to a
    temporary folder (the loader's and ours), and HOME has no ~/.kube/config."""
    from kubernetes.config import incluster_config

    from guardedcron.cli import kubeconfig as module

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (account / "namespace").write_text("jobs\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(account / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(account / "ca.crt"))
    monkeypatch.setattr(module, "SERVICE_ACCOUNT_NAMESPACE", account / "namespace")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}

    info = connection_info(env=env)
    assert (info.server, info.scheme, info.token, info.default_namespace) == (
        "https://[fd00::1]:443", "Bearer", "pod-token", "jobs")
    assert info.ca_path == str(account / "ca.crt")
    # Outside a pod, with no kubeconfig either: one line naming both.
    with pytest.raises(KubeconfigError, match=r"no kubeconfig at ~/.kube/config .* not in a pod"):
        connection_info(env={})


# --- tls-server-name: a real TLS server whose certificate names neither 127.0.0.1 nor localhost
SERVER_NAME = "api.guardedcron.test"
RUN = {"job": "nightly-29345678", "outcome": "Succeeded", "fence": 7}


class _Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"apiVersion": "guardedcron.io/v1alpha1", "kind": "GuardedCronJob",
                           "metadata": {"name": "nightly", "namespace": "team-a"},
                           "status": {"recentRuns": [RUN]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the answers, not the server's log."""


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[tuple[str, Path, list[str | None]]]:
    """An HTTPS server on 127.0.0.1 with a certificate for SERVER_NAME only (made as the
    devenv makes the control plane's): its URL, its CA and the SNI names it was sent."""
    ca = KeyPair(tmp_path / "ca.crt", tmp_path / "ca.key")
    leaf = KeyPair(tmp_path / "api.crt", tmp_path / "api.key")
    for command in (build_ca_command(ca, "test-ca"),
                    build_leaf_command(leaf, ca, "/CN=api", "serverAuth", (f"DNS:{SERVER_NAME}",))):
        subprocess.run(command, capture_output=True, check=True, timeout=60)
    sent: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert, leaf.key)

    def record(_sock: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        sent.append(name)

    context.sni_callback = record
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca.cert, sent
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_tls_server_name_is_sent_and_checked(tls_api: tuple[str, Path, list[str | None]],
                                             tmp_path: Path) -> None:
    url, ca, sent = tls_api

    def runs(server_name: str | None) -> subprocess.CompletedProcess[str]:
        cluster: dict[str, Any] = {"server": url, "certificate-authority": str(ca)}
        if server_name is not None:
            cluster["tls-server-name"] = server_name
        config = kubeconfig(tmp_path / "config", {"token": "t"})
        document = json.loads(config.read_text())
        document["clusters"] = [{"name": "c", "cluster": cluster}]
        config.write_text(json.dumps(document))
        return subprocess.run([str(Path(GUARDEDCRON).parent / "kubectl-gcj"), "runs", "nightly", "-o", "json",
                               "--kubeconfig", str(config)], capture_output=True, text=True, timeout=60,
                              check=False)

    named = runs(SERVER_NAME)
    assert named.returncode == 0, named
    assert json.loads(named.stdout)["items"] == [{"namespace": "team-a", "guardedCronJob": "nightly", **RUN}]
    assert sent == [SERVER_NAME]
    # Without it the certificate does not name the address: refused, as kubectl refuses it.
    unnamed = runs(None)
    assert unnamed.returncode == contract.EXIT_UNAVAILABLE, unnamed
    assert "certificate" in unnamed.stderr and "127.0.0.1" in unnamed.stderr
    # A name the certificate does not carry is refused too: the name is checked, not only sent.
    wrong = runs("other.guardedcron.test")
    assert wrong.returncode == contract.EXIT_UNAVAILABLE, wrong
    assert "other.guardedcron.test" in wrong.stderr
