"""An image registry on this machine, for the README's "push the image, install the chart"
path: Debian's `docker-registry` (the CNCF Distribution registry, installed by
.ci/bootstrap) on a free loopback port, refusing anonymous pulls (htpasswd logins).

The node's containerd pulls from it over plain HTTP, as it does for any registry on
127.0.0.1, with the credentials the kubelet takes from a pod's imagePullSecrets; Docker
pushes to it without TLS for the same reason. Pushes log in with a Docker configuration
folder of their own, so the machine's ~/.docker is never touched.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Final

import bcrypt

from guardedcron_devenv.docker_engine import DockerEngine
from guardedcron_devenv.long_step import log_tail
from guardedcron_devenv.postgres import free_port

REGISTRY: Final = "/usr/bin/docker-registry"
USER: Final = "puller"
# Bounds on every wait in this module (seconds).
START_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 10.0
PUSH_TIMEOUT_S: Final = 300.0


class RegistryError(RuntimeError):
    """The registry did not start, or a push to it failed."""


class LocalRegistry:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = f"127.0.0.1:{free_port()}"
        self.password = secrets.token_urlsafe(18)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / "registry.log"

    def __enter__(self) -> LocalRegistry:
        self.folder.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt()).decode()
        (self.folder / "htpasswd").write_text(f"{USER}:{hashed}\n")
        config = self.folder / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "storage": {"filesystem": {"rootdirectory": str(self.folder / "data")}},
            "http": {"addr": self.host},
            "auth": {"htpasswd": {"realm": "guardedcron-tests", "path": str(self.folder / "htpasswd")}},
        }))
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._answer() != 401:  # up, and refusing the anonymous
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RegistryError(f"{REGISTRY} did not answer on {self.host} within "
                                    f"{START_TIMEOUT_S:.0f} s:\n{log_tail(self.log_path)}")
            time.sleep(0.2)
        return self

    def _answer(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def docker_config_json(self) -> str:
        """The `.dockerconfigjson` of a pull secret for this registry."""
        auth = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"username": USER, "password": self.password, "auth": auth}}})

    def push(self, engine: DockerEngine, image: str) -> str:
        """Push the engine's `image` (name:tag) here; returns its name in this registry."""
        name = f"{self.host}/{image}"
        with tempfile.TemporaryDirectory(prefix="docker-config-") as docker_config:
            env = {"DOCKER_CONFIG": docker_config}
            steps = (
                (("tag", image, name), None),
                (("login", "--username", USER, "--password-stdin", self.host), self.password),
                (("push", name), None),
            )
            for args, stdin in steps:
                done = subprocess.run(engine.command(*args), env=engine.env(env), input=stdin,
                                      capture_output=True, text=True, timeout=PUSH_TIMEOUT_S)
                if done.returncode != 0:
                    raise RegistryError(f"docker {args[0]} {name} failed: {done.stderr.strip()}")
        return name
