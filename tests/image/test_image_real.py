"""The image built from the Dockerfile by a real Docker engine, run the way pods run it.

Every container runs with a read-only root filesystem, no capabilities and no privilege
escalation, as the image's own user; writable places exist only where the pod gives them
(the chart's /tmp emptyDir for the operator, the run volume and the kubelet's termination
log for the guard and the keeper).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from guardedcron import contract
from guardedcron.cli.main import COMMANDS
from guardedcron_devenv.docker_engine import COMMAND_TIMEOUT_S, DockerEngine
from guardedcron_devenv.image import VENV_COPY, BuiltImage
from guardedcron_devenv.postgres import free_port
from tests.support.image import IMAGE_TEST_TIMEOUT_S, REPO, run_in_image

pytestmark = [pytest.mark.image, pytest.mark.timeout(IMAGE_TEST_TIMEOUT_S)]

USER = "65532:65532"  # the chart's runAsUser and the guard's default
CHART_TMP = "/tmp:size=16m"  # the chart's only writable place for the operator (emptyDir, 16Mi)
RUN_VOLUME = f"{contract.RUN_DIR}:size=1m,uid=65532,gid=65532"  # the run volume (memory emptyDir)
VENV_LAYER_CEILING = 80 * 2**20
STOP_TIMEOUT_S = 30


def test_the_image_runs_as_65532_and_its_root_filesystem_is_read_only(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    configured = docker_engine.check("image", "inspect", "--format", "{{.Config.User}}", built_image.tag)
    assert configured.strip() == USER
    probe = f"{contract.RUN_DIR}-probe"
    result = run_in_image(
        docker_engine, built_image.tag,
        ["-c", f'id -u; id -g; for f in /opt/guardedcron/probe /tmp/probe {probe}; do '
               '(: > "$f") || echo "refused $f"; done'],
        entrypoint="sh",
    )  # fmt: skip
    assert result.stdout.split("\n", 2)[:2] == ["65532", "65532"], result.stderr
    assert result.stdout.count("refused") == 3, result.stdout
    assert result.stderr.count("Read-only file system") == 3, result.stderr


def test_the_image_starts_guardedcron_and_never_writes_bytecode(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    config = json.loads(docker_engine.check("image", "inspect", "--format", "{{json .Config}}",
                                            built_image.tag))
    assert config["Entrypoint"] == ["guardedcron"] and config["Cmd"] == ["--help"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].startswith("/opt/guardedcron/bin:")


def test_the_final_image_only_copies_the_finished_venv_onto_the_base(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    """Nothing runs in the final stage: no build tool or installer touches the image."""
    def history(image: str) -> list[str]:
        return docker_engine.check("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).splitlines()

    base = history(built_image.base)
    own = history(built_image.tag)[: -len(base)]
    assert own, "the image adds nothing to its base"
    ran = [step for step in own
           if (step.startswith("/bin/sh -c ") and "#(nop)" not in step) or step.startswith("RUN ")]
    assert not ran, ran
    assert any(VENV_COPY.search(step) for step in own)


PROBE_DOCKERFILE = "ARG BASE\nFROM ${BASE}\nCOPY . /context\n"


def test_the_build_context_is_only_what_the_build_reads(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    """The engine applies .dockerignore; a probe build copies whatever it was sent."""
    probe = "guardedcron-context-probe:latest"
    built = subprocess.run(
        docker_engine.command("build", "--force-rm", "--network", "none", "--build-arg",
                              f"BASE={built_image.base}", "--tag", probe, "--file", "-", str(REPO)),
        input=PROBE_DOCKERFILE, env=docker_engine.env({"DOCKER_BUILDKIT": "0"}),
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    try:
        assert built.returncode == 0, built.stdout + built.stderr
        listed = run_in_image(docker_engine, probe, ["/context", "-type", "f"], entrypoint="find")
    finally:
        docker_engine.run("image", "rm", "--force", probe)
    assert listed.returncode == 0, listed.stderr
    files = [Path(line).relative_to("/context") for line in listed.stdout.splitlines()]
    assert {path.parts[0] for path in files} == {"pyproject.toml", "README.md", "LICENSE", "operator",
                                                 "crds"}
    assert not [p for p in files if p.parts[:2] == ("operator", "devenv")], "the devenv is sent"
    assert not [p for p in files if "__pycache__" in p.parts or p.suffix == ".pyc"]
    assert Path("operator/guardedcron/cli/main.py") in files


def test_default_command_prints_the_help_naming_every_command(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    result = run_in_image(docker_engine, built_image.tag)
    assert result.returncode == 0, result.stderr
    assert "usage: guardedcron" in result.stdout
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_loads_from_the_installed_wheel(
    docker_engine: DockerEngine, built_image: BuiltImage, command: str
) -> None:
    result = run_in_image(docker_engine, built_image.tag, [command, "--help"])
    assert result.returncode == 0, result.stderr
    assert f"guardedcron {command}" in result.stdout


def test_operator_starts_its_command_line_with_only_the_charts_tmp_writable(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    result = run_in_image(docker_engine, built_image.tag, ["operator", "--help"], tmpfs=[CHART_TMP])
    assert result.returncode == 0, result.stderr
    assert "usage: guardedcron operator" in result.stdout



def test_the_operators_trim_finds_glibc_in_the_image(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    """The operator gives its start-up peak back through glibc's malloc_trim
    (guardedcron.cli.operator_memory): the image's C library has it."""
    probe = "from guardedcron.cli.operator_memory import allocator_trim; print(allocator_trim().allocator)"
    found = run_in_image(docker_engine, built_image.tag, ["-c", probe], entrypoint="python")
    assert (found.returncode, found.stdout.strip()) == (0, "glibc"), found.stderr


def test_every_example_renders_in_the_image(docker_engine: DockerEngine, built_image: BuiltImage) -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples, "examples/ holds no GuardedCronJob"
    for example in examples:
        result = run_in_image(
            docker_engine, built_image.tag, ["render", "-f", f"/examples/{example.name}"],
            volumes=[f"{REPO / 'examples'}:/examples:ro"],
        )  # fmt: skip
        assert result.returncode == 0, f"{example.name}: {result.stderr}"
        kinds = {doc.get("kind") for doc in yaml.safe_load_all(result.stdout) if doc}
        assert kinds == {"CronJob"}, f"{example.name}: rendered {kinds}"


def test_render_reads_the_crd_the_image_ships(docker_engine: DockerEngine, built_image: BuiltImage) -> None:
    env = json.loads(docker_engine.check("image", "inspect", "--format", "{{json .Config.Env}}",
                                         built_image.tag))
    crd_path = dict(item.split("=", 1) for item in env)["GUARDEDCRON_CRD"]
    result = run_in_image(docker_engine, built_image.tag, [crd_path], entrypoint="cat")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "crds" / Path(crd_path).name).read_text()


def test_keep_help(docker_engine: DockerEngine, built_image: BuiltImage) -> None:
    result = run_in_image(docker_engine, built_image.tag, ["keep", "--help"],
                          tmpfs=[RUN_VOLUME])
    assert result.returncode == 0, result.stderr
    assert "renew a lease until SIGTERM" in result.stdout


# --- the guard and the keeper against the test PostgreSQL ---------------------------------


@pytest.fixture
def termination_log(tmp_path: Path) -> Path:
    """What the kubelet mounts at /dev/termination-log: an empty file the container may write."""
    path = tmp_path / "termination-log"
    path.touch()
    path.chmod(0o666)
    tmp_path.chmod(0o755)
    return path


def guard_run(
    engine: DockerEngine, image: str, args: list[str], dsn: str, termination_log: Path,
    *, detach: bool = False,
) -> subprocess.CompletedProcess[str]:
    # --network host: the test PostgreSQL listens on 127.0.0.1 of this machine.
    return run_in_image(
        engine, image, args, network="host", tmpfs=[RUN_VOLUME],
        volumes=[f"{termination_log}:{contract.TERMINATION_LOG}"],
        env_names=[contract.ENV_DSN], env={contract.ENV_DSN: dsn}, detach=detach,
    )  # fmt: skip


def termination_message(path: Path) -> dict[str, object]:
    message = json.loads(path.read_text())
    assert isinstance(message, dict)
    return message


@pytest.fixture
def keeper_container(docker_engine: DockerEngine) -> Iterator[list[str]]:
    started: list[str] = []
    yield started
    for container in started:
        docker_engine.run("rm", "--force", container)


def test_acquire_and_keep_in_the_image_hold_and_release_the_lease_then_the_slot_is_skipped(
    docker_engine: DockerEngine, built_image: BuiltImage, dsn: str, tmp_path: Path,
    termination_log: Path, keeper_container: list[str],
) -> None:
    lock, slot = "image/nightly", "29000000"
    acquire = ["acquire", "--lock", lock, "--holder", "ns/pod-a", "--lease-seconds", "60",
               "--slot", slot, "--out", contract.RUN_DIR]
    won = guard_run(docker_engine, built_image.tag, acquire, dsn, termination_log)
    assert won.returncode == contract.EXIT_OK, won.stdout + won.stderr
    message = termination_message(termination_log)
    assert message[contract.KEY_OUTCOME] == contract.GuardOutcome.ACQUIRED
    fence = message[contract.KEY_FENCE]
    assert isinstance(fence, int) and fence > 0

    keeper_log = tmp_path / "keeper"
    keeper_log.mkdir()
    keeper_termination = keeper_log / "termination-log"
    keeper_termination.touch()
    keeper_termination.chmod(0o666)
    keeper_log.chmod(0o755)
    keep = ["keep", "--lock", lock, "--holder", "ns/pod-a", "--fence", str(fence),
            "--lease-seconds", "60", "--out", contract.RUN_DIR]
    started = guard_run(docker_engine, built_image.tag, keep, dsn, keeper_termination, detach=True)
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    keeper_container.append(container)
    time.sleep(2)  # the keeper connects and holds; SIGTERM then asks it to release
    assert docker_engine.check("inspect", "--format", "{{.State.Running}}", container).strip() == "true"
    docker_engine.check("stop", f"--time={STOP_TIMEOUT_S}", container, timeout_s=STOP_TIMEOUT_S + 30)
    exit_code = docker_engine.check("inspect", "--format", "{{.State.ExitCode}}", container).strip()
    logs = docker_engine.run("logs", container)
    assert exit_code == str(contract.EXIT_OK), logs.stdout + logs.stderr
    kept = termination_message(keeper_termination)
    assert kept[contract.KEY_OUTCOME] == contract.KeeperOutcome.RELEASED, kept
    with psycopg.connect(dsn) as conn:
        released = conn.execute(
            "SELECT released_at IS NOT NULL FROM guardedcron.leases WHERE lock_name = %s", (lock,)
        ).fetchone()
    assert released == (True,)

    termination_log.write_text("")
    again = [*acquire[:4], "ns/pod-b", *acquire[5:]]
    skipped = guard_run(docker_engine, built_image.tag, again, dsn, termination_log)
    assert skipped.returncode == contract.EXIT_NOT_ACQUIRED, skipped.stdout + skipped.stderr
    message = termination_message(termination_log)
    assert message[contract.KEY_OUTCOME] == contract.GuardOutcome.SKIPPED
    assert message[contract.KEY_REASON] == contract.AcquireReason.SLOT_CLAIMED
    assert message[contract.KEY_HOLDER] == "ns/pod-a" and message[contract.KEY_FENCE] == fence


def test_acquire_in_the_image_says_the_database_is_unreachable_without_the_password(
    docker_engine: DockerEngine, built_image: BuiltImage, termination_log: Path
) -> None:
    password = "image-test-secret-Zq7"
    dsn = f"postgresql://guardedcron:{password}@127.0.0.1:{free_port()}/postgres"
    result = guard_run(
        docker_engine, built_image.tag,
        ["acquire", "--lock", "image/unreachable", "--holder", "ns/pod-a", "--lease-seconds", "60",
         "--slot", "29000001", "--connect-timeout", "2"],
        dsn, termination_log,
    )  # fmt: skip
    assert result.returncode == contract.EXIT_UNAVAILABLE, result.stdout + result.stderr
    message = termination_message(termination_log)
    assert message[contract.KEY_OUTCOME] == contract.GuardOutcome.ERROR
    for text in (result.stdout, result.stderr, termination_log.read_text()):
        assert password not in text


# --- what the image holds ------------------------------------------------------------------

INSTALLED = """
import importlib.metadata, importlib.util, json, pathlib
import guardedcron
package = pathlib.Path(guardedcron.__file__).parent
print(json.dumps({
    "distributions": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "devenv_importable": importlib.util.find_spec("guardedcron_devenv") is not None,
    "old_devenv": (package / "devenv").exists(),
    "sources": sum(1 for _ in package.rglob("*.py")),
    "compiled": sum(1 for p in package.rglob("*.py")
                    if pathlib.Path(importlib.util.cache_from_source(str(p))).is_file()),
}))
"""


def test_the_image_holds_the_runtime_only_compiled_and_without_installers(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    result = run_in_image(docker_engine, built_image.tag, ["-c", INSTALLED], entrypoint="python")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert "guardedcron" in found["distributions"]
    assert "guardedcron-devenv" not in found["distributions"]
    assert not found["devenv_importable"], "the development environment leaked into the image"
    assert not found["old_devenv"], "the old in-package devenv is back"
    assert not set(found["distributions"]) & {"pip", "setuptools", "wheel"}, found["distributions"]
    # bytecode was compiled at build time, so a read-only start never needs to write it
    assert found["compiled"] == found["sources"] > 0, found


def test_demo_in_the_image_says_in_one_line_what_to_install(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    result = run_in_image(docker_engine, built_image.tag, ["demo", "--local", "--slots", "1"],
                          tmpfs=[CHART_TMP])
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "make demo" in lines[0] and "operator/devenv" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_venv_layer_is_small(built_image: BuiltImage) -> None:
    assert 0 < built_image.venv_layer_bytes < VENV_LAYER_CEILING, built_image.summary()
    assert built_image.venv_layer_bytes < built_image.size_bytes


def test_the_image_was_built_on_the_stand_in_not_pulled(
    docker_engine: DockerEngine, built_image: BuiltImage
) -> None:
    """No registry is reachable here: the base must be the locally made one."""
    base_layers = docker_engine.check("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                      built_image.base)
    image_layers = docker_engine.check("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                       built_image.tag)
    base, image = json.loads(base_layers), json.loads(image_layers)
    assert image[: len(base)] == base


def test_a_kubeconfig_login_in_the_image_says_in_one_line_that_the_client_is_left_out(
    docker_engine: DockerEngine, built_image: BuiltImage, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    kubeconfig.chmod(0o644)
    tmp_path.chmod(0o755)  # the image's user 65532 reads it
    result = run_in_image(docker_engine, built_image.tag,
                          ["trigger", "nightly", "--kubeconfig", "/kube/config"],
                          volumes=[f"{tmp_path}:/kube:ro"], tmpfs=[CHART_TMP])
    assert result.returncode != 0, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "official kubernetes client" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
