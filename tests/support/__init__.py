"""Helpers for tests: run the real `guardedcron` command and read its answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def json(self) -> dict[str, object]:
        line = self.stdout.strip().splitlines()[-1]
        value: dict[str, object] = json.loads(line)
        return value


def run_cli(
    args: Sequence[str],
    *,
    dsn: str | None = None,
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
    timeout: float = 60,
) -> CliResult:
    environment = {k: v for k, v in os.environ.items() if k != "GUARDEDCRON_DSN"}
    if dsn is not None:
        environment["GUARDEDCRON_DSN"] = dsn
    environment.update(env or {})
    started = time.monotonic()
    proc = subprocess.run(
        [*prefix, GUARDEDCRON, *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
