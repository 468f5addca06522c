"""The Dockerfile without a Docker engine: its rules checked from the parsed file,
hadolint run over it, and its build steps replayed in a clean folder.

The replay follows the Dockerfile itself (COPY from the .dockerignore'd context,
ARG/ENV/WORKDIR, every RUN through /bin/sh), with the image's absolute paths moved
under a scratch root and Debian's /usr/bin/python3.11 standing in for the base
image's Python 3.11. The result is then run the way the image runs: through the
ENTRYPOINT, as the image's USER, with a read-only root filesystem.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from guardedcron.cli.main import COMMANDS
from tests.packaging.dockerfile import (
    Dockerfile,
    build_context,
    env_pairs,
    expand,
    ignore_patterns,
    parse,
)

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
BASE_PYTHON = Path("/usr/bin/python3.11")  # Debian's: readable by any user, unlike pyenv's
# The base image's own PATH; these folders exist in the image and are not moved.
BASE_PATH = ("/usr/local/bin", "/usr/local/sbin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|make|build-essential|apt-get|apk|dnf|yum|pip|pip3|setuptools|wheel|git|curl|wget)\b"
)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse(DOCKERFILE.read_text())


# --- rules read from the file


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "style", "--disable-ignore-pragma",
         "--no-color", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_a_real_check(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install gcc\nUSER root\n")
    result = subprocess.run([str(hadolint), "--no-color", str(bad)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # the latest tag


def test_build_is_multi_stage_with_a_named_builder(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2
    assert dockerfile.stages[0].name == "builder"
    copies_from = [i.flags_and_args()[0].get("from") for i in dockerfile.final.all("COPY")]
    assert "builder" in copies_from


def test_every_base_image_has_a_pinned_tag_not_latest(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        image = expand(stage.base, dockerfile.global_args)
        name, _, digest = image.partition("@")
        repository, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
        assert tag or digest, f"{image}: no tag"
        assert tag != "latest", f"{image}: latest"
        assert repository.split("/")[-1] == "python" and tag.startswith("3.11-slim"), image


def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    users = dockerfile.final.all("USER")
    assert users, "no USER in the final stage"
    user, _, group = users[-1].text.partition(":")
    assert user.isdigit() and int(user) != 0, users[-1].text
    assert not group or (group.isdigit() and int(group) != 0)
    assert int(user) == 65532  # the chart's runAsUser and the guard's default


def test_entrypoint_is_guardedcron_in_exec_form(dockerfile: Dockerfile) -> None:
    (entrypoint,) = dockerfile.final.all("ENTRYPOINT")
    assert entrypoint.exec_form == ["guardedcron"]
    for cmd in dockerfile.final.all("CMD"):
        assert cmd.exec_form is not None


def test_final_stage_has_no_build_tools(dockerfile: Dockerfile) -> None:
    for instruction in dockerfile.final.instructions:
        assert instruction.keyword not in ("RUN", "ADD"), (
            f"line {instruction.line}: the final stage only copies the finished venv"
        )
    for instruction in dockerfile.final.all("COPY"):
        assert not BUILD_TOOLS.search(instruction.text), instruction.text


def test_python_writes_no_bytecode_at_run_time(dockerfile: Dockerfile) -> None:
    env = dict(pair for i in dockerfile.final.all("ENV") for pair in env_pairs(i))
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"


def test_run_steps_name_image_paths_only_through_variables(dockerfile: Dockerfile) -> None:
    """So that the replay below, which moves the paths, runs the very same commands."""
    for stage in dockerfile.stages:
        for instruction in stage.all("RUN"):
            without_variables = re.sub(r"\"?\$\{?\w+\}?\"?", "VAR", instruction.text)
            assert not re.search(r"(^|[\s\"'=])/", without_variables), instruction.text


def test_context_is_only_what_the_build_reads() -> None:
    context = build_context(REPO, ignore_patterns((REPO / ".dockerignore").read_text()))
    tops = {path.parts[0] for path in context}
    assert tops <= {"pyproject.toml", "README.md", "operator", "crds"}
    assert not [p for p in context if p.parts[:2] == ("operator", "devenv")], "the devenv is not shipped"
    assert not [p for p in context if "__pycache__" in p.parts or p.parts[-1].endswith(".pyc")]


# --- the build replayed


@dataclass
class Replay:
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "0"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def move(self, value: str) -> str:
        """Image paths in a variable's value, moved under the scratch root."""
        parts = []
        for part in value.split(":"):
            keep = not part.startswith("/") or part in BASE_PATH
            parts.append(part if keep else str(self.path(part)))
        return ":".join(parts)


def replay(dockerfile: Dockerfile, root: Path, shims: Path) -> Replay:
    context = root / "context"
    for relative in build_context(REPO, ignore_patterns((REPO / ".dockerignore").read_text())):
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, context / relative)

    base_env = {"PATH": ":".join((str(shims), *BASE_PATH)), "HOME": str(root / "home"),
                "LANG": "C.UTF-8"}
    state = Replay(root)
    for stage in dockerfile.stages:
        state.env = dict(base_env)
        state.workdir = "/"
        variables = dict(dockerfile.global_args)
        for instruction in stage.instructions:
            keyword = instruction.keyword
            if keyword == "ARG":
                key, _, default = instruction.text.partition("=")
                variables[key] = state.env[key] = state.move(default)
            elif keyword == "ENV":
                for key, value in env_pairs(instruction):
                    state.env[key] = state.move(expand(value, {**variables, **state.env}))
            elif keyword == "WORKDIR":
                state.workdir = instruction.text
                state.path(state.workdir).mkdir(parents=True, exist_ok=True)
            elif keyword == "COPY":
                copy(state, instruction.flags_and_args(), context)
            elif keyword == "RUN":
                result = subprocess.run(
                    ["/bin/sh", "-c", instruction.text], cwd=state.path(state.workdir),
                    env=state.env, capture_output=True, text=True, timeout=900, check=False,
                )
                assert result.returncode == 0, (
                    f"Dockerfile line {instruction.line} failed:\n{result.stdout}\n{result.stderr}"
                )
            elif keyword == "USER":
                state.user = instruction.text
            elif keyword == "ENTRYPOINT":
                state.entrypoint = instruction.exec_form or []
            elif keyword == "CMD":
                state.cmd = instruction.exec_form or []
            else:
                assert keyword == "LABEL", f"the replay does not know {keyword}"
    return state


def copy(state: Replay, flags_args: tuple[dict[str, str], list[str]], context: Path) -> None:
    flags, args = flags_args
    *sources, destination = args
    target = destination if destination.startswith("/") else f"{state.workdir}/{destination}"
    for source in sources:
        # --from=builder: in the replay every stage shares one root, so the source
        # is already at its image path.
        origin = state.path(source) if "from" in flags else context / source
        into = state.path(target)
        if origin.is_dir():
            if origin.resolve() != into.resolve():
                shutil.copytree(origin, into, dirs_exist_ok=True)
        else:
            assert origin.exists(), f"COPY {source}: not in the build context"
            into = into / origin.name if target.endswith("/") else into
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, into)


@pytest.fixture(scope="module")
def image(dockerfile: Dockerfile) -> Iterator[Replay]:
    root = Path(tempfile.mkdtemp(prefix="guardedcron-image-"))
    root.chmod(0o755)  # the image's user must be able to reach the venv
    shims = root / "shims"
    shims.mkdir()
    (shims / "python").symlink_to(BASE_PYTHON)
    try:
        yield replay(dockerfile, root, shims)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_image(image: Replay, args: Sequence[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ENTRYPOINT + args (default: CMD) as the image's USER with / read-only."""
    uid, _, gid = image.user.partition(":")
    env = {**image.env, "HOME": "/nonexistent"}
    command = [*image.entrypoint, *(image.cmd if args is None else args)]
    executable = shutil.which(command[0], path=env["PATH"])
    assert executable, f"{command[0]} is not on the image's PATH"
    isolate = (
        "mount --rbind / / && mount -o remount,bind,ro / && "
        f'exec setpriv --reuid={uid} --regid={gid or uid} --clear-groups -- "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--", "/bin/sh", "-c", isolate, "sh", executable, *command[1:]],
        cwd=image.path(image.workdir), env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )


def test_default_command_prints_the_help(image: Replay) -> None:
    result = run_image(image)
    assert result.returncode == 0, result.stderr
    assert "usage: guardedcron" in result.stdout
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_sub_command_loads_from_the_installed_wheel(image: Replay, command: str) -> None:
    result = run_image(image, [command, "--help"])
    assert result.returncode == 0, result.stderr
    assert f"guardedcron {command}" in result.stdout


def test_the_run_really_is_read_only_and_unprivileged(image: Replay) -> None:
    probe = image.path("/opt/guardedcron/bin/probe-write")
    result = subprocess.run(
        ["unshare", "--mount", "--", "/bin/sh", "-c",
         "mount --rbind / / && mount -o remount,bind,ro / && "
         f"exec setpriv --reuid=65532 --regid=65532 --clear-groups -- sh -c 'id -u; : > {probe}'"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.stdout.strip() == "65532"
    assert "Read-only file system" in result.stderr
    assert not probe.exists()


def test_examples_render_from_the_image(image: Replay) -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples, "examples/ holds no GuardedCronJob"
    for example in examples:
        result = run_image(image, ["render", "-f", str(example)])
        assert result.returncode == 0, f"{example.name}: {result.stderr}"
        kinds = {doc.get("kind") for doc in yaml.safe_load_all(result.stdout) if doc}
        assert kinds == {"CronJob"}, f"{example.name}: rendered {kinds}"


def test_nothing_was_written_and_no_build_tools_remain(image: Replay) -> None:
    venv = image.path("/opt/guardedcron")
    before = sorted(p.relative_to(venv) for p in venv.rglob("*"))
    assert run_image(image, ["render", "--help"]).returncode == 0
    assert sorted(p.relative_to(venv) for p in venv.rglob("*")) == before
    installed = {p.name.split("-")[0].lower() for p in venv.glob("lib/python3.11/site-packages/*.dist-info")}
    assert "guardedcron" in installed
    assert not installed & {"pip", "setuptools", "wheel"}, installed
    # bytecode was compiled at build time, so start-up need not write it
    assert list(venv.glob("lib/python3.11/site-packages/guardedcron/__pycache__/*.pyc"))


def test_image_has_no_development_environment_and_demo_says_what_to_install(image: Replay) -> None:
    site = image.path("/opt/guardedcron/lib/python3.11/site-packages")
    assert (site / "guardedcron").is_dir()
    assert not list(site.glob("guardedcron_devenv*")), "the development environment leaked into the image"
    assert not list(site.glob("guardedcron/devenv")), "the old in-package devenv is back"
    result = run_image(image, ["demo", "--local", "--slots", "1"])
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "make demo" in lines[0] and "operator/devenv" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_image_layer_size_is_small(image: Replay) -> None:
    venv = image.path("/opt/guardedcron")
    size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"venv layer: {size / 2**20:.1f} MiB")
    assert size < 80 * 2**20, f"the venv layer is {size / 2**20:.1f} MiB"


def test_crd_for_render_is_where_the_image_says(image: Replay) -> None:
    crd = Path(image.env["GUARDEDCRON_CRD"])
    assert crd.is_file(), crd
    assert crd.read_bytes() == (REPO / "crds" / crd.name).read_bytes()
    assert os.access(crd, os.R_OK)
