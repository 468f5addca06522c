"""Run by the Python of a venv holding the declared minimum version of every runtime
dependency (tests/packaging/test_minimum_versions.py), with the source tree's operator/
on PYTHONPATH: what the operator and the CLI do first, on those versions.

Prints one JSON object on stdout saying what it saw; any failure is a traceback and a
non-zero exit, which the test shows whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import logging
import pkgutil
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any


def import_every_module() -> list[str]:
    import guardedcron

    names = []
    for module in pkgutil.walk_packages(guardedcron.__path__, "guardedcron."):
        if module.name.endswith(".__main__"):  # `python -m guardedcron`: importing it runs it
            continue
        importlib.import_module(module.name)
        names.append(module.name)
    return names


async def scrape_metrics() -> str:
    from guardedcron.observability.metrics import create_metrics, record_suspension, start_metrics_server

    metrics = create_metrics()
    record_suspension(metrics, namespace="billing", name="nightly", suspended=True)
    server = await start_metrics_server(0, metrics.registry, host="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        await server.stop()


def exec_plugin_login(folder: Path) -> dict[str, Any]:
    from guardedcron.cli.kubeconfig import connection_info

    plugin = folder / "login.sh"
    plugin.write_text('#!/bin/sh\necho \'{"apiVersion":"client.authentication.k8s.io/v1",'
                      '"kind":"ExecCredential","status":{"token":"probe-token"}}\'\n')
    plugin.chmod(0o755)
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
            "interactiveMode": "Never"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
    }))
    info = connection_info(str(kubeconfig))
    return {"server": info.server, "scheme": info.scheme, "token": info.token,
            "namespace": info.default_namespace}


def json_log_line() -> dict[str, Any]:
    from guardedcron.observability.logs import configure_logging

    configure_logging("info", "json")
    stream = io.StringIO()
    for handler in logging.getLogger().handlers:
        handler.setStream(stream)  # type: ignore[attr-defined]
    logging.getLogger("kopf.objects").info("probe", extra={"k8s_ref": {
        "kind": "GuardedCronJob", "namespace": "billing", "name": "nightly"}})
    parsed: dict[str, Any] = json.loads(stream.getvalue())
    return parsed


def version_line() -> str:
    from guardedcron.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--version"])
    assert code == 0, code
    return out.getvalue().strip()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        login = exec_plugin_login(Path(folder))
    report = {
        "modules": import_every_module(),
        "metrics": asyncio.run(scrape_metrics()),
        "login": login,
        "log": json_log_line(),
        "version": version_line(),
    }
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
