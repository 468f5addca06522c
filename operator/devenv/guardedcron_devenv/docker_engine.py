"""A Docker engine on this machine, for building and running the guardedcron image.

A running engine at $DOCKER_HOST, or on the default socket, is used as it is. Otherwise
Debian's `dockerd` (package docker.io, installed by .ci/bootstrap) is started on the
default socket in the background, as root, and left running like a system service (stop
it with `kill $(cat /var/run/docker.pid)`).
It is started without a bridge and without iptables rules: every build and test
container here uses the host's network (`--network host`), so the engine changes
nothing in the machine's network set-up, and the node tests' own bridge and rules meet
no Docker chains.

The client is Debian's too (/usr/bin/docker, same release as the engine): another
client earlier on PATH may speak a newer API or send builds to a BuildKit plugin that
is not installed here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import Progress, build_cache_root
from guardedcron_devenv.long_step import log_tail

DOCKER_CLI: Final = Path("/usr/bin/docker")
DOCKERD: Final = "/usr/sbin/dockerd"
DEFAULT_HOST: Final = "unix:///var/run/docker.sock"
ENGINE_FLAGS: Final = ("--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false")
# Bounds on every wait in this module (seconds).
START_TIMEOUT_S: Final = 60.0  # a started dockerd must answer within this
PROBE_TIMEOUT_S: Final = 10.0  # one `docker version` round trip
COMMAND_TIMEOUT_S: Final = 120.0  # default for one short docker command (inspect, run, rmi)
PROBE_INTERVAL_S: Final = 0.5
STOP_GRACE_S: Final = 15.0  # an engine we gave up on gets this long to stop its containerd
BOOTSTRAP_HINT: Final = "run `bash .ci/bootstrap` (it installs Debian's docker.io)"


class EngineError(RuntimeError):
    """No Docker engine answers and none could be started; the message says why."""


@dataclass(frozen=True)
class DockerEngine:
    """A Docker client bound to one engine's socket."""

    host: str = DEFAULT_HOST
    cli: Path = DOCKER_CLI

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.host
        env.update(extra or {})
        return env

    def command(self, *args: str) -> list[str]:
        return [str(self.cli), *args]

    def run(
        self,
        *args: str,
        timeout_s: float = COMMAND_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """One docker command, bounded; the caller reads the return code."""
        return subprocess.run(
            self.command(*args), env=self.env(env), capture_output=True, text=True,
            timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def check(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """One docker command that must succeed; its standard output."""
        result = self.run(*args, timeout_s=timeout_s)
        if result.returncode != 0:
            raise EngineError(
                f"`docker {' '.join(args)}` failed (exit {result.returncode}): "
                f"{result.stderr.strip()}"
            )
        return result.stdout

    def server_version(self) -> str | None:
        """The engine's version, or None when nothing answers on the socket."""
        try:
            result = self.run("version", "--format", "{{.Server.Version}}", timeout_s=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
        version = result.stdout.strip()
        return version if result.returncode == 0 and version else None


def engine_log_path() -> Path:
    return build_cache_root(os.environ) / "docker" / "dockerd.log"


def dockerd_command(host: str = DEFAULT_HOST) -> list[str]:
    return [DOCKERD, f"--host={host}", *ENGINE_FLAGS]


def ensure_engine(progress: Progress = print) -> DockerEngine:
    """The engine at $DOCKER_HOST if set, else on the default socket, started first if
    nothing answers there (an engine elsewhere is never started by us)."""
    engine = DockerEngine(host=os.environ.get("DOCKER_HOST") or DEFAULT_HOST)
    if not os.access(engine.cli, os.X_OK):
        raise EngineError(f"Debian's docker client {engine.cli} is missing: {BOOTSTRAP_HINT}")
    if engine.server_version() is not None:
        return engine
    if engine.host != DEFAULT_HOST:
        raise EngineError(f"no Docker engine answers at DOCKER_HOST={engine.host}; unset "
                          "DOCKER_HOST to use (or start) this machine's engine")
    if not os.access(DOCKERD, os.X_OK):
        raise EngineError(f"no Docker engine answers on {engine.host} and {DOCKERD} is missing: "
                          f"{BOOTSTRAP_HINT}")
    if os.geteuid() != 0:
        raise EngineError(f"no Docker engine answers on {engine.host}, and starting one "
                          f"({DOCKERD}) needs root")
    log_path = engine_log_path()
    progress(f"guardedcron: starting the Docker engine (log: {log_path})")
    start_engine(engine, dockerd_command(engine.host), log_path, START_TIMEOUT_S)
    return engine


# Started engines stay referenced so their handles outlive this call.
_STARTED: list[subprocess.Popen[bytes]] = []


def start_engine(
    engine: DockerEngine, command: Sequence[str], log_path: Path, timeout_s: float
) -> subprocess.Popen[bytes]:
    """Start `command` detached, logging to `log_path`, and wait up to timeout_s for the
    engine to answer; EngineError (naming the log) if it exits first or never answers."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # not in our process group: Ctrl-C on make leaves it be
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        if engine.server_version() is not None:
            _STARTED.append(process)
            return process
        returncode = process.poll()
        if returncode is not None:
            raise EngineError(
                f"dockerd exited (status {returncode}) before answering on {engine.host}; "
                f"its log: {log_path}\n{log_tail(log_path)}"
            )
        if time.monotonic() >= deadline:
            stop_engine(process)
            raise EngineError(
                f"dockerd did not answer on {engine.host} within {timeout_s:.0f} s and was "
                f"stopped; its log: {log_path}\n{log_tail(log_path)}"
            )
        time.sleep(PROBE_INTERVAL_S)


def stop_engine(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM first (dockerd then stops the containerd it started), SIGKILL to the group."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
