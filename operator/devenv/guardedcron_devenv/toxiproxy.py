"""A real fault-injecting TCP proxy (Shopify's Toxiproxy) for the partition and chaos tests.

Network faults between the guard and PostgreSQL cannot be faked faithfully: a silent
partition (no RST, no FIN) is exactly the case a mock would get wrong. Toxiproxy sits on
a loopback port in front of the database and applies "toxics" to live connections:

    timeout (timeout=0)   swallow every byte, never close: a silent partition
    latency (+ jitter)    delay each chunk
    reset_peer            close with RST
    slicer                cut data into small, delayed pieces
    bandwidth             limit the rate in KB/s

No package registry here ships Toxiproxy, but it is a Go module. Our own tiny module in
`go/toxiproxy/` pins one release; it is built once per version (and source digest) into

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/toxiproxy-<version>/bin/toxiproxy-server

The HTTP API is spoken with urllib; every request has a timeout, so no call here can hang.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from guardedcron_devenv.binaries import (
    BUILD_LOG,
    GO_BUILD_TIMEOUT_S,
    GO_SOURCES,
    BuildError,
    BuildTarget,
    Progress,
    binaries_current,
    build_cache_root,
    build_cached,
    build_go_env,
    required_version,
    sources_digest,
)
from guardedcron_devenv.long_step import run_long_step
from guardedcron_devenv.postgres import free_port

TOXIPROXY_SOURCES: Final = GO_SOURCES / "toxiproxy"
TOXIPROXY_MODULE: Final = "github.com/Shopify/toxiproxy/v2"
BINARY_NAME: Final = "toxiproxy-server"
# The one binary of go/toxiproxy/ (its main package is the module's root).
TOXIPROXY: Final = BuildTarget(BINARY_NAME, TOXIPROXY_SOURCES.name, ".")
LOOPBACK: Final = "127.0.0.1"
# Bounds on every wait in this module (seconds).
STARTUP_TIMEOUT_S: Final = 15.0
API_TIMEOUT_S: Final = 5.0
STOP_TIMEOUT_S: Final = 5.0
STREAMS: Final = ("upstream", "downstream")


class ToxiproxyError(RuntimeError):
    """The proxy server did not start, or its API refused a request."""


def toxiproxy_version() -> str:
    """The Toxiproxy release our go.mod pins."""
    return required_version((TOXIPROXY_SOURCES / "go.mod").read_text(), TOXIPROXY_MODULE)


def build_command(out_dir: Path, version: str) -> list[str]:
    # Stamp the release into the binary, so GET /version names it (otherwise "git").
    ldflags = f"-s -w -X {TOXIPROXY_MODULE}.Version={version}"
    return ["go", "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(out_dir / BINARY_NAME), "."]


def build_stamp(sources: str, version: str) -> dict[str, str]:
    """What a build is keyed on: a change to any value makes the cached binary stale."""
    return {
        "toxiproxy": version,
        "sources": sources,
        "command": " ".join(build_command(Path("bin"), version)),
    }


def ensure_toxiproxy(progress: Progress = print) -> Path:
    """Return the cached toxiproxy-server, building it first if absent, stale or forced."""
    version = toxiproxy_version()
    cache_root = build_cache_root(os.environ)
    version_dir = cache_root / f"toxiproxy-{version}"
    binary = version_dir / "bin" / BINARY_NAME
    build_cached(
        version_dir,
        lambda: build_stamp(sources_digest(TOXIPROXY_SOURCES), version),
        lambda wanted: binaries_current(binary.parent, (TOXIPROXY,), wanted),
        lambda: _build(binary, version, cache_root, progress),
    )
    return binary


def _build(binary: Path, version: str, cache_root: Path, progress: Progress) -> None:
    if shutil.which("go") is None:
        raise BuildError(
            f"the Go toolchain ('go') is not on PATH; it is needed once to build toxiproxy {version}"
        )
    # Build into a scratch folder and move the binary in only when complete, so an
    # interrupted build never leaves a half-written binary that looks usable.
    scratch = binary.parent.parent / "bin.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    binary.parent.mkdir(parents=True, exist_ok=True)
    log_path = binary.parent.parent / BUILD_LOG
    log_path.write_text("")
    progress(f"guardedcron: building toxiproxy {version} from its Go module (a minute when cold; "
             f"log: {log_path})...")
    started = time.monotonic()
    # A line every 15 s while go runs, and the same bound as the control plane's builds.
    run_long_step(build_command(scratch, version), what="building toxiproxy", log_path=log_path,
                  timeout_s=GO_BUILD_TIMEOUT_S, progress=progress,
                  env=build_go_env(os.environ, cache_root), cwd=TOXIPROXY_SOURCES)
    os.replace(scratch / BINARY_NAME, binary)
    shutil.rmtree(scratch, ignore_errors=True)
    progress(f"guardedcron: built toxiproxy in {time.monotonic() - started:.0f} s: {binary}")


class _Api:
    """The server's HTTP API: JSON in and out, a timeout on every request."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, method: str, path: str, body: dict[str, object] | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                payload = response.read()
                is_json = "json" in response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace").strip()
            raise ToxiproxyError(f"toxiproxy {method} {path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {error}") from None
        if not is_json:
            return payload.decode(errors="replace")
        return json.loads(payload) if payload.strip() else None


@dataclass(frozen=True)
class Proxy:
    """One listening port in front of one upstream; toxics apply to its live connections."""

    name: str
    listen_port: int
    upstream: str
    _api: _Api
    _names: itertools.count[int]

    def dsn_for(self, dsn: str) -> str:
        """The same connection string (URI or key=value), pointed at this proxy."""
        params = conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params["host"] = LOOPBACK
        params["port"] = str(self.listen_port)
        return make_conninfo("", **params)

    def add_toxic(
        self,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        **attributes: int | float,
    ) -> str:
        """Apply a toxic of `kind` to one direction; returns its name (for remove_toxic).

        "downstream" is data from PostgreSQL to the client, "upstream" the other way.
        """
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {STREAMS}, not {stream!r}")
        if not 0.0 <= toxicity <= 1.0:
            raise ValueError(f"toxicity must be within [0, 1], not {toxicity}")
        name = f"{kind}_{stream}_{next(self._names)}"
        body: dict[str, object] = {
            "name": name,
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": dict(attributes),
        }
        self._api.call("POST", f"/proxies/{self.name}/toxics", body)
        return name

    def blackhole(self, stream: str | None = None) -> list[str]:
        """Swallow every byte on one stream (or, with None, both) and never close: a silent
        partition. Removing the toxic closes the connections it held."""
        streams = STREAMS if stream is None else (stream,)
        return [self.add_toxic("timeout", direction, timeout=0) for direction in streams]

    def remove_toxic(self, name: str) -> None:
        self._api.call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxic_names(self) -> list[str]:
        listed = self._api.call("GET", f"/proxies/{self.name}/toxics")
        if not isinstance(listed, list):
            raise ToxiproxyError(f"toxiproxy listed toxics as {type(listed).__name__}")
        return [str(toxic["name"]) for toxic in listed if isinstance(toxic, dict)]

    def clear(self) -> None:
        """Remove every toxic: the network heals (connections held by a blackhole close)."""
        for name in self.toxic_names():
            self.remove_toxic(name)

    def disable(self) -> None:
        """Close every connection and refuse new ones (connection refused) until enable()."""
        self._api.call("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self._api.call("POST", f"/proxies/{self.name}", {"enabled": True})

    def delete(self) -> None:
        self._api.call("DELETE", f"/proxies/{self.name}")


class Toxiproxy:
    """A toxiproxy-server on a free loopback port: `with Toxiproxy() as server: ...`."""

    def __init__(self, binary: Path | None = None) -> None:
        self.binary = binary
        self.port = 0
        self.version = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix="guardedcron-toxiproxy-"))
        self.log = self._workdir / "toxiproxy.log"
        self._api = _Api("")

    def __enter__(self) -> Toxiproxy:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        binary = self.binary or ensure_toxiproxy()
        self.port = free_port()
        self._api = _Api(f"http://{LOOPBACK}:{self.port}")
        with self.log.open("ab") as log:
            # Its own process group, so stop() ends it and nothing it started lingers.
            self._process = subprocess.Popen(
                [str(binary), "-host", LOOPBACK, "-port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise ToxiproxyError(
                    f"toxiproxy-server exited with {self._process.returncode}:\n{self.log_tail()}"
                )
            try:
                self.version = str(self._api.call("GET", "/version"))
                return
            except ToxiproxyError:
                if time.monotonic() > deadline:
                    raise ToxiproxyError(
                        f"toxiproxy-server did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def proxy(self, name: str, upstream: str) -> Proxy:
        """Create a proxy to `upstream` ("host:port") on a free loopback port."""
        created = self._api.call(
            "POST",
            "/proxies",
            {"name": name, "listen": f"{LOOPBACK}:0", "upstream": upstream, "enabled": True},
        )
        if not isinstance(created, dict) or not isinstance(created.get("listen"), str):
            raise ToxiproxyError(f"toxiproxy answered an unexpected proxy: {created!r}")
        listen_port = int(str(created["listen"]).rsplit(":", 1)[1])
        return Proxy(name, listen_port, upstream, self._api, itertools.count(1))
