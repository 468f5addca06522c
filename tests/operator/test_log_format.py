"""`guardedcron operator --log-format json` as the chart starts it, against the API
emulator: every line on stderr is one JSON object, and the lines about a
GuardedCronJob carry its kind, namespace and name as fields. `--version` reads the
installed package's metadata."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from guardedcron.kube import KubeClient
from tests.operator.passes import create_gcj
from tests.support.emulator import GuardedEmulator
from tests.support.gcj import base_gcj, put

GUARDEDCRON = str(Path(sys.executable).parent / "guardedcron")
NAME = "nightly-invoices"
# How long the operator may take to log its first pass over the object.
FIRST_PASS_SECONDS = 60.0


async def read_json_lines(stream: asyncio.StreamReader, until: Any, seconds: float) -> list[dict[str, Any]]:
    """Parse stderr line by line (each must be one JSON object) until `until(entry)`."""
    entries: list[dict[str, Any]] = []
    async with asyncio.timeout(seconds):
        while True:
            raw = await stream.readline()
            assert raw, f"the operator ended before the line wanted; it printed {entries}"
            entry = json.loads(raw)  # a line that is not JSON fails here, with the line
            assert isinstance(entry, dict), raw
            entries.append(entry)
            if until(entry):
                return entries


async def test_json_log_lines_name_the_guarded_cronjob(
        api: GuardedEmulator, client: KubeClient, kubeconfig: Path) -> None:
    await create_gcj(client, put(base_gcj(), "metadata.name", NAME))
    process = await asyncio.create_subprocess_exec(
        GUARDEDCRON, "operator", "--log-format", "json", "--standalone", "-n", "billing",
        "--metrics-port", "0", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert process.stderr is not None
    try:
        entries = await read_json_lines(
            process.stderr, lambda e: e.get("kind") == "GuardedCronJob" and e.get("name") == NAME,
            FIRST_PASS_SECONDS)
    finally:
        process.terminate()
        rest = await asyncio.wait_for(process.stderr.read(), 30)
        await asyncio.wait_for(process.wait(), 30)
    about = entries[-1]
    assert about["namespace"] == "billing" and about["level"] in ("info", "debug", "warning")
    assert about["logger"].startswith("kopf") and about["message"]
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert entry["time"].endswith("Z")
    # The lines written while stopping are JSON too.
    for line in rest.decode().splitlines():
        assert isinstance(json.loads(line), dict), line


def test_text_is_the_default_and_a_bad_format_is_refused() -> None:
    result = subprocess.run([GUARDEDCRON, "operator", "--log-format", "yaml"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 64
    assert "argument --log-format: invalid choice: 'yaml'" in result.stderr
    usage = subprocess.run([GUARDEDCRON, "operator", "--help"], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "--log-format {text,json}" in usage


def test_version_comes_from_the_installed_metadata() -> None:
    plugin = str(Path(GUARDEDCRON).with_name("kubectl-gcj"))
    for command in ([GUARDEDCRON, "--version"], [plugin, "--version"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        name = "guardedcron" if command[0] == GUARDEDCRON else "kubectl gcj"
        assert result.stdout == f"{name} {version('guardedcron')}\n"
