"""`guardedcron operator` does not load the official `kubernetes` client, which the CLI
depends on and kopf would import at its own import (21 MiB, about a second of start-up):
the real command's imports, as Python reports them (PYTHONPROFILEIMPORTTIME), have kopf
and none of the client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GUARDEDCRON = str(Path(sys.executable).parent / "guardedcron")
# How long the command may take to import kopf and start logging in.
START_SECONDS = 60.0


def imported_by(command: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    """The modules a command imported before it was stopped, and its other output."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert process.stderr is not None
    modules: set[str] = set()
    other: list[str] = []
    try:
        for line in process.stderr:
            if line.startswith("import time:"):
                modules.add(line.rsplit("|", 1)[-1].strip())
                if "guardedcron.handlers.registry" in modules:  # kopf and every handler are in
                    break
            else:
                other.append(line)
    finally:
        process.kill()
        process.wait(START_SECONDS)
    return modules, "".join(other)


def test_the_operator_process_never_imports_the_official_client(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "c", '
                          '"clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}], '
                          '"users": [{"name": "u", "user": {"token": "t"}}], '
                          '"contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}')
    modules, other = imported_by([GUARDEDCRON, "operator", "--standalone", "--metrics-port", "0"],
                                 {"KUBECONFIG": str(kubeconfig)})
    assert {"kopf", "guardedcron.handlers.registry"} <= modules, other
    # Python reports kopf's attempts too (`kubernetes`, `kubernetes.client`, refused at once);
    # a client that loaded would show its own modules, e.g. kubernetes.client.configuration.
    loaded = {m for m in modules if m.startswith("kubernetes.")} - {"kubernetes.client"}
    assert not loaded, other


def test_kopf_alone_would_import_it() -> None:
    """The reason for the hiding: without it, importing kopf imports the client."""
    probe = ("import sys, kopf; print('kubernetes.client' in sys.modules); "
             "from guardedcron.cli.lean_operator import hide_official_client; print(hide_official_client())")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.split() == ["True", "False"]
