"""Kubernetes credentials for the CLI's commands that talk to a cluster.

Loaded by the official `kubernetes` client's loaders, so every kind of login kubectl
users have works: tokens and client certificates, exec credential plugins (the cloud
logins: EKS, GKE, AKS), OIDC tokens, and a pod's service account (in-cluster config).
What the loader produces (server, CA, client certificate, Authorization header) is
handed to the operator's own lean client as a `kopf.ConnectionInfo`, so the commands
keep that client's error words. The operator itself keeps kopf's login: importing
the official client costs it memory and start-up for logins a pod never uses.

Which credentials: `--kubeconfig`, else `$KUBECONFIG` (paths joined by ':', merged as
kubectl merges them), else `~/.kube/config`; with none of those files, the pod's service
account. A login that cannot be had is one line naming the reason, never a traceback
and never a credential: the loader reports a failed exec plugin only through logging
and carries on without credentials, so its records are caught and turned into that line.

Bound: the loader waits for an exec plugin without limit (a cloud login may wait for a
person or a network). Here the whole login gets $GUARDEDCRON_LOGIN_TIMEOUT_SECONDS
(default 120 s), then the command ends with exit 69; the plugin's process, which the
loader does not let us reach, is left to end by itself.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kopf
import yaml

from guardedcron.contract import EXIT_FAILURE, EXIT_UNAVAILABLE, EXIT_USAGE
from guardedcron.kube.credentials import ClusterLogin

ENV_KUBECONFIG = "KUBECONFIG"
ENV_LOGIN_TIMEOUT = "GUARDEDCRON_LOGIN_TIMEOUT_SECONDS"
DEFAULT_LOGIN_TIMEOUT_S = 120.0
DEFAULT_KUBECONFIG = "~/.kube/config"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "default"
# How much of a loader's or plugin's message the one-line error keeps.
MESSAGE_MAX = 300
# Token shapes a plugin's message may carry (a JWT, or any long unbroken run of token
# characters): hidden before the message is shown.
_TOKEN_SHAPES = re.compile(r"eyJ[\w-]*\.[\w-]*\.?[\w-]*|[A-Za-z0-9_.+=~-]{32,}")
HIDDEN = "***"


class KubeconfigError(Exception):
    """No usable credentials; the message is one line without secrets, `code` the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def kubeconfig_paths(kubeconfig: str | None, env: Mapping[str, str]) -> str:
    """The kubeconfig file(s) to read, as kubectl chooses them ('…:…' when several)."""
    return kubeconfig or env.get(ENV_KUBECONFIG) or DEFAULT_KUBECONFIG


def _existing(paths: str) -> bool:
    """Whether any of the kubeconfig files is there. One that is there but cannot be read
    (its mode, or a folder on its path this user may not enter) is bad input naming it,
    as kubectl stops there too, rather than a file passed over."""
    found = False
    for text in filter(None, paths.split(os.pathsep)):
        path = Path(text).expanduser()
        try:
            if not path.is_file():
                continue
            with path.open("rb"):
                found = True
        except OSError as error:
            reason = "permission denied for this user" if isinstance(error, PermissionError) \
                else (error.strerror or type(error).__name__).lower()
            raise KubeconfigError(f"cannot read the kubeconfig {str(path)[:200]}: {reason} "
                                  f"(set --kubeconfig or ${ENV_KUBECONFIG} to one it can read)") from None
    return found


def connection_info(kubeconfig: str | None = None, context: str | None = None,
                    env: Mapping[str, str] = os.environ) -> kopf.ConnectionInfo:
    """Credentials for the chosen kubeconfig context, else the pod's service account.
    The answer's `default_namespace` is the context's namespace (or the pod's)."""
    paths = kubeconfig_paths(kubeconfig, env)
    if kubeconfig is None and context is None and not _existing(paths) and env.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster(env)
    if not _existing(paths):
        raise KubeconfigError(f"no kubeconfig at {paths} (set --kubeconfig or ${ENV_KUBECONFIG}) "
                              "and not in a pod with a service account")
    return _bounded(lambda: _from_kubeconfig(paths, context), login_timeout(env))


def login_timeout(env: Mapping[str, str]) -> float:
    """Seconds a login may take ($GUARDEDCRON_LOGIN_TIMEOUT_SECONDS, default 120)."""
    text = env.get(ENV_LOGIN_TIMEOUT, "")
    if not text:
        return DEFAULT_LOGIN_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= 86_400):  # NaN fails this too
        raise KubeconfigError(f"${ENV_LOGIN_TIMEOUT} must be a number of seconds from 0 to 86400, "
                              f"not {text[:40]!r}")
    return seconds


def _bounded(login: Callable[[], kopf.ConnectionInfo], seconds: float) -> kopf.ConnectionInfo:
    """`login()` in a daemon thread, waited for at most `seconds`: a plugin that never
    answers cannot hold the command (nor its exit) past the bound."""
    outcome: list[kopf.ConnectionInfo | BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append(login())
        except BaseException as error:
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=work, name="kubeconfig-login", daemon=True).start()
    if not done.wait(seconds):
        raise KubeconfigError(f"logging in with the kubeconfig's user did not finish within {seconds:g} s "
                              f"(an exec credential plugin waiting for input or its network?); "
                              f"${ENV_LOGIN_TIMEOUT} sets the bound", EXIT_UNAVAILABLE)
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def context_namespace(kubeconfig: str | None = None, context: str | None = None,
                      env: Mapping[str, str] = os.environ) -> str:
    """The namespace of the chosen context, read without logging in (no plugin runs):
    for commands that only need the name. 'default' when there is no kubeconfig."""
    paths = kubeconfig_paths(kubeconfig, env)
    if not _existing(paths):
        if kubeconfig is not None or context is not None:
            raise KubeconfigError(f"no kubeconfig at {paths}")
        return _pod_namespace() or DEFAULT_NAMESPACE
    _official_client_present()
    with _loader_errors():
        return _namespace_of(paths, context)


def _official_client_present() -> None:
    """The image leaves the official client out (Dockerfile): say so in one line."""
    if importlib.util.find_spec("kubernetes") is None:
        raise KubeconfigError("logging in through a kubeconfig needs the official kubernetes "
                              "client, which this installation (the guardedcron image) leaves "
                              "out; run the command where `pip install guardedcron` installed it")


def _from_kubeconfig(paths: str, context: str | None) -> kopf.ConnectionInfo:
    _official_client_present()
    from kubernetes import client, config

    configuration = client.Configuration()
    with _loader_errors(), _caught_log_records() as records:
        namespace = _namespace_of(paths, context)
        config.load_kube_config(config_file=paths, context=context,
                                client_configuration=configuration, persist_config=False)
    if records:  # e.g. "exec: process returned 1. …": the loader went on without credentials
        raise KubeconfigError(f"cannot log in with the kubeconfig's user: {clean(records[0])}",
                              EXIT_FAILURE)
    return _as_connection_info(configuration, namespace)


def _in_cluster(env: Mapping[str, str]) -> kopf.ConnectionInfo:
    """load_incluster_config's loader, given the environment this call was given."""
    _official_client_present()
    from kubernetes import client
    from kubernetes.config import incluster_config

    configuration = client.Configuration()
    with _loader_errors():
        incluster_config.InClusterConfigLoader(
            token_filename=incluster_config.SERVICE_TOKEN_FILENAME,
            cert_filename=incluster_config.SERVICE_CERT_FILENAME,
            environ=env,
        ).load_and_set(configuration)
    return _as_connection_info(configuration, _pod_namespace() or DEFAULT_NAMESPACE)


def _namespace_of(paths: str, context: str | None) -> str:
    from kubernetes import config

    contexts, current = config.list_kube_config_contexts(paths)
    wanted = context or (current or {}).get("name")
    for entry in contexts:
        if entry.get("name") == wanted:
            return str((entry.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE)
    raise KubeconfigError(f"the kubeconfig has no context named {wanted!r}")


def _pod_namespace() -> str | None:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def _as_connection_info(configuration: Any, namespace: str) -> kopf.ConnectionInfo:
    # The Authorization value: "Bearer …" (newer loaders use the key BearerToken, older
    # ones authorization; in-cluster writes "bearer"), or "Basic …" for a user and password.
    header = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization")
    scheme = token = None
    if header:
        scheme, _, token = str(header).partition(" ")
        scheme = "Bearer" if scheme.lower() == "bearer" else scheme
    return ClusterLogin(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token or None,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
        default_namespace=namespace,
        proxy_url=configuration.proxy or None,
        tls_server_name=configuration.tls_server_name or None,
    )


def clean(message: str) -> str:
    """One line, bounded, with anything shaped like a token hidden."""
    line = " ".join(message.split())
    line = _TOKEN_SHAPES.sub(HIDDEN, line)
    return line if len(line) <= MESSAGE_MAX else line[:MESSAGE_MAX] + "..."


@contextmanager
def _loader_errors() -> Iterator[None]:
    """The loaders' exceptions as one KubeconfigError each (YAML errors quote the text,
    which may be a token: only the line is named)."""
    from kubernetes.config import ConfigException

    try:
        yield
    except KubeconfigError:
        raise
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise KubeconfigError(f"the kubeconfig is not valid YAML{at}") from None
    except ConfigException as error:
        raise KubeconfigError(f"the kubeconfig cannot be used: {clean(str(error))}") from None
    except (KeyError, TypeError, AttributeError) as error:  # the loader indexing a wrong shape
        raise KubeconfigError("the kubeconfig is not shaped like one (a YAML mapping with "
                              f"clusters, users and contexts lists): {type(error).__name__}: "
                              f"{clean(str(error))}") from None
    except (OSError, ValueError) as error:
        raise KubeconfigError(f"the kubeconfig cannot be used: {type(error).__name__}: "
                              f"{clean(str(error))}") from None


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _caught_log_records() -> Iterator[list[str]]:
    """The loader's error records (it logs on the root logger), kept from the terminal."""
    root = logging.getLogger()
    collector = _Collect()
    saved = root.handlers[:]
    root.handlers = [collector]
    try:
        yield collector.messages
    finally:
        root.handlers = saved
