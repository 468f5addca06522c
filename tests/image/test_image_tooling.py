"""The tooling around the image build: bounded waits with clear errors, the stand-in base's
cache key, and the clean-up that must never reach through a mount."""

from __future__ import annotations

import hashlib
import subprocess
import uuid
from pathlib import Path

import pytest

from guardedcron_devenv.binaries import BuildError
from guardedcron_devenv.docker_engine import (
    START_TIMEOUT_S,
    DockerEngine,
    EngineError,
    dockerd_command,
    ensure_engine,
    start_engine,
    stop_engine,
)
from guardedcron_devenv.image import BuiltImage, ensure_image, stage_results
from guardedcron_devenv.long_step import run_long_step
from guardedcron_devenv.python_base import (
    KEYED_PACKAGES,
    MIRROR,
    SUITE,
    ca_bundle_path,
    current_recipe,
    mounts_under,
    remove_tree,
    suite_version,
)
from tests.support.image import IMAGE_TEST_TIMEOUT_S, run_in_image

pytestmark = [pytest.mark.image, pytest.mark.timeout(IMAGE_TEST_TIMEOUT_S)]


def quiet(_: str) -> None:
    pass


# --- the engine ------------------------------------------------------------------------------


def test_a_dockerd_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    engine = DockerEngine(host=f"unix://{tmp_path}/docker.sock")
    log_path = tmp_path / "dockerd.log"
    with pytest.raises(EngineError) as raised:
        start_engine(engine, [*dockerd_command(engine.host), "--no-such-flag"], log_path, 30.0)
    message = str(raised.value)
    assert "dockerd exited (status 1) before answering" in message
    assert str(log_path) in message
    assert "unknown flag: --no-such-flag" in message


def test_an_engine_that_never_answers_is_stopped_at_the_bound(tmp_path: Path) -> None:
    engine = DockerEngine(host=f"unix://{tmp_path}/docker.sock")
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"  # a sleep length no other process uses
    with pytest.raises(EngineError) as raised:
        start_engine(engine, ["sleep", marker], tmp_path / "dockerd.log", 1.0)
    assert "did not answer" in str(raised.value) and "within 1 s" in str(raised.value)
    running = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True, check=False)
    assert running.stdout == "", "the engine we gave up on is still running"


# --- slow steps --------------------------------------------------------------------------------


def test_a_failing_step_names_its_log_and_shows_its_tail(tmp_path: Path) -> None:
    log_path = tmp_path / "step.log"
    with pytest.raises(BuildError) as raised:
        run_long_step(["sh", "-c", "echo reading the mirror; echo no such suite >&2; exit 3"],
                      what="debootstrap", log_path=log_path, timeout_s=60, progress=quiet)
    message = str(raised.value)
    assert message.startswith("debootstrap failed (exit 3); full log: " + str(log_path))
    assert "no such suite" in message and "reading the mirror" in message


def test_a_step_past_its_bound_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.25"
    with pytest.raises(BuildError) as raised:
        run_long_step(["sh", "-c", f"sleep {marker}; echo never"], what="docker build",
                      log_path=tmp_path / "step.log", timeout_s=1, progress=quiet)
    assert "docker build did not finish within 1 s and was stopped" in str(raised.value)
    running = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True, check=False)
    assert running.stdout == "", "the step's child outlived it"


def test_a_context_without_a_dockerfile_is_refused_before_any_engine_work(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"no Dockerfile in .*give the repository's folder"):
        ensure_image("guardedcron:never", tmp_path, progress=quiet)


def test_a_broken_dockerfile_fails_the_build_with_dockers_own_words(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text("ARG PYTHON_IMAGE\nFROM ${PYTHON_IMAGE}\nRUN exit 7\n")
    with pytest.raises(BuildError) as raised:
        ensure_image("guardedcron:broken-on-purpose", tmp_path, progress=quiet, engine=docker_engine)
    assert "docker build of guardedcron:broken-on-purpose failed" in str(raised.value)
    assert "returned a non-zero code: 7" in str(raised.value)


# --- the stand-in base's key -----------------------------------------------------------------

MADISON = f"""\
python3.11 | 3.11.2-6+deb12u9 | http://deb.debian.org/debian-security {SUITE}-security/main amd64 Packages
python3.11 | 3.11.2-6+deb12u8 | {MIRROR} {SUITE}/main amd64 Packages
python3.11 | 3.11.2-6+deb12u8 | {MIRROR} {SUITE}-updates/main amd64 Packages
"""


def test_the_key_takes_the_version_debootstrap_installs_from_the_suite_itself() -> None:
    assert suite_version(MADISON, "python3.11", SUITE, MIRROR) == "3.11.2-6+deb12u8"
    with pytest.raises(BuildError, match=r"no version of libc6 in bookworm/main .*apt-get update"):
        suite_version(MADISON, "libc6", SUITE, MIRROR)


def test_the_key_follows_this_machines_packages_and_ca_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = current_recipe()
    assert [name for name, _ in recipe.versions] == list(KEYED_PACKAGES)
    assert recipe == current_recipe(), "the key is not stable"
    other_bundle = tmp_path / "bundle.crt"
    other_bundle.write_bytes(recipe.ca_bundle.read_bytes() + b"\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(other_bundle))
    changed = current_recipe()
    assert changed.key != recipe.key and changed.image != recipe.image
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "absent.crt"))
    with pytest.raises(BuildError, match=r"no CA bundle at .*absent\.crt"):
        current_recipe()


# --- clean-up never reaches through a mount ---------------------------------------------------


def test_removing_a_bootstrap_folder_unmounts_before_deleting(tmp_path: Path) -> None:
    """debootstrap may bind the host's /dev into its target; deleting through that bind
    would delete the host's files. Here a bind of a folder standing for the host's /dev."""
    host_dev = tmp_path / "host-dev"
    host_dev.mkdir()
    (host_dev / "null").write_text("the host's")
    target = tmp_path / "rootfs.partial"
    (target / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host_dev), str(target / "dev")], check=True, timeout=30)
    try:
        assert mounts_under(target) == [str((target / "dev").resolve())]
        remove_tree(target)
    finally:
        subprocess.run(["umount", str(target / "dev")], capture_output=True, timeout=30, check=False)
    assert not target.exists()
    assert (host_dev / "null").read_text() == "the host's"


def test_a_docker_host_where_nothing_answers_is_named_and_never_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    with pytest.raises(EngineError, match=rf"no Docker engine answers at DOCKER_HOST=unix://{socket}; unset"):
        ensure_engine(progress=quiet)
    assert not socket.exists()


def test_a_started_engine_answers_within_the_bound_without_a_bridge(
    docker_engine: DockerEngine, tmp_path: Path
) -> None:
    """The start path a fresh machine takes, on a second engine with its own socket and
    folders so the machine's engine is untouched."""
    engine = DockerEngine(host=f"unix://{tmp_path}/docker.sock")
    own = (f"--data-root={tmp_path}/data", f"--exec-root={tmp_path}/exec",
           f"--pidfile={tmp_path}/docker.pid")
    process = start_engine(engine, [*dockerd_command(engine.host), *own], tmp_path / "dockerd.log",
                           START_TIMEOUT_S)
    try:
        assert engine.server_version() == docker_engine.server_version()
        networks = engine.check("network", "ls", "--format", "{{.Name}}").split()
        assert "bridge" not in networks, "the engine made a bridge of its own"
    finally:
        stop_engine(process)
        for point in sorted(mounts_under(tmp_path), key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False, timeout=30)
    assert process.returncode == 0, "dockerd did not stop cleanly on SIGTERM"


def test_the_stand_in_base_is_python_311_on_path_with_this_machines_ca_bundle_and_slim(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    probe = ("command -v python; python --version; sha256sum /etc/ssl/certs/ca-certificates.crt; "
             "ls /usr/share/man /usr/share/locale /var/lib/apt/lists /var/cache/apt/archives "
             "| grep -v ':$' | grep -v '^$' | grep -v '^partial$' | wc -l")
    result = run_in_image(docker_engine, built_image.base, ["-c", probe], entrypoint="sh")
    assert result.returncode == 0, result.stderr
    where, version, bundle, leftovers = result.stdout.splitlines()
    assert where == "/usr/bin/python" and version.startswith("Python 3.11."), result.stdout
    machine_bundle = hashlib.sha256(ca_bundle_path().read_bytes()).hexdigest()
    assert bundle.split()[0] == machine_bundle, "pip in the build would not trust this machine's CAs"
    assert leftovers.strip() == "0", "manuals, translations or apt caches shipped"


TWO_STAGES = """\
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE} AS builder
COPY value /value
RUN cp /value /built
FROM ${PYTHON_IMAGE}
COPY --from=builder /built /opt/guardedcron
"""


def test_a_rebuild_removes_what_the_previous_build_of_its_tag_left_untagged(
    docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its own record of stages
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(TWO_STAGES)
    tag = "guardedcron-housekeeping-probe:1"
    kept = []
    try:
        (context / "value").write_text("first")
        first = ensure_image(tag, context, progress=quiet, engine=docker_engine)
        first_stages = stage_results(next((tmp_path / "cache").rglob("build-*.log")).read_text())
        (context / "value").write_text("second")
        second = ensure_image(tag, context, progress=quiet, engine=docker_engine)
        second_stages = stage_results(next((tmp_path / "cache").rglob("build-*.log")).read_text())
        kept = second_stages
        assert len(first_stages) == len(second_stages) == 2
        assert first.image_id.removeprefix("sha256:").startswith(first_stages[-1])
        assert second.image_id != first.image_id
        for image in first_stages:
            assert docker_engine.run("image", "inspect", image).returncode != 0, f"{image} left behind"
        for image in second_stages:  # the builder stage stays: it is the next build's cache
            assert docker_engine.run("image", "inspect", image).returncode == 0, f"{image} removed"
    finally:
        docker_engine.run("image", "rm", tag)
        for image in kept:
            docker_engine.run("image", "rm", image)
