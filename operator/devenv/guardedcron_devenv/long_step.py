"""Run a slow build step (`go build`, debootstrap, `docker build`) with a bound, a log and
a pulse.

A cold Go or image build spends minutes in single commands. Their output goes to a log
file rather than the terminal; every PULSE_S seconds one line says what is still going,
for how long, where its log is and what it printed last, so a waiting person (or CI log)
sees progress without the noise. A step that outlives its bound is killed with its whole
process group, and the error names the log.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

# Where progress lines go: print, or pytest's terminal reporter.
Progress = Callable[[str], None]
FAILURE_TAIL_LINES: Final = 40
PULSE_S: Final = 15.0
POLL_S: Final = 1.0
LAST_LINE_CHARS: Final = 100


class BuildError(RuntimeError):
    """A step (a Go build, an image build) failed; the message names its log and ends with
    the log's last lines."""


def run_long_step(
    command: Sequence[str],
    *,
    what: str,
    log_path: Path,
    timeout_s: float,
    progress: Progress,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """Run `command`, appending its output to `log_path`; BuildError if it fails or overruns."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("a") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
        next_pulse = started + PULSE_S
        while True:
            try:
                returncode = process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now - started > timeout_s:
                    _kill_group(process)
                    raise BuildError(
                        f"{what} did not finish within {timeout_s:.0f} s and was stopped; "
                        f"full log: {log_path}\n{log_tail(log_path)}"
                    ) from None
                if now >= next_pulse:
                    progress(f"guardedcron: {what}: still running after {now - started:.0f} s "
                             f"(log: {log_path}) ... {last_line(log_path)}")
                    next_pulse += PULSE_S
    if returncode != 0:
        raise BuildError(
            f"{what} failed (exit {returncode}); full log: {log_path}\n{log_tail(log_path)}"
        )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def log_tail(log_path: Path, lines: int = FAILURE_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def last_line(log_path: Path) -> str:
    tail = log_tail(log_path, lines=1).strip()
    return tail if len(tail) <= LAST_LINE_CHARS else tail[:LAST_LINE_CHARS] + "..."
