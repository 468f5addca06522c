"""`make image`: the guardedcron image, built from the repository's Dockerfile by a real engine.

    python -m guardedcron_devenv.image [--tag guardedcron:0.1.0] [--context .]

Three steps, each reused when already done: a Docker engine (docker_engine.py), a local
stand-in for the python:3.11-slim-bookworm base (python_base.py; no registry is
reachable here), then

    docker build --network host --build-arg PYTHON_IMAGE=<stand-in> --tag <tag> <context>

Docker's layer cache makes a rebuild of unchanged sources take seconds. The Dockerfile is
the one users build with `docker build .` against the real base; nothing in it knows
about the stand-in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import BuildError, Progress, build_cache_root
from guardedcron_devenv.docker_engine import DockerEngine, EngineError, ensure_engine
from guardedcron_devenv.long_step import run_long_step
from guardedcron_devenv.python_base import ensure_python_base

IMAGE_REPOSITORY: Final = "guardedcron"
VENV_DIR: Final = "/opt/guardedcron"
BUILD_TIMEOUT_S: Final = 20 * 60.0  # a cold build (pip downloads every dependency) takes about a minute
# The build's COPY of the finished virtual environment, as `docker history` shows it in the
# classic builder ("COPY dir:<digest> in /opt/guardedcron") and in BuildKit.
FILE_UNSAFE: Final = re.compile(r"[^\w.-]")
STEP_RESULT: Final = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
STAGE_START: Final = re.compile(r"^Step \d+/\d+ : FROM ", re.IGNORECASE)
VENV_COPY: Final = re.compile(rf"\bCOPY\b.*\s{re.escape(VENV_DIR)}\b")


def default_tag() -> str:
    return f"{IMAGE_REPOSITORY}:{version('guardedcron')}"


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str
    base: str
    size_bytes: int  # `docker image inspect`'s Size: every layer, the base's included
    venv_layer_bytes: int  # the layer holding /opt/guardedcron

    def summary(self) -> str:
        return (
            f"{self.tag} ({self.image_id[:19]}): {self.size_bytes / 1e6:.1f} MB, of which the "
            f"{VENV_DIR} layer {self.venv_layer_bytes / 1e6:.1f} MB; base {self.base}"
        )


def ensure_image(
    tag: str, context: Path, progress: Progress = print, engine: DockerEngine | None = None
) -> BuiltImage:
    """Build `context`'s Dockerfile as `tag` on the stand-in base (layer cache reused)."""
    dockerfile = context / "Dockerfile"
    if not dockerfile.is_file():
        raise BuildError(f"no Dockerfile in {context}: give the repository's folder as the context")
    engine = engine or ensure_engine(progress)
    base = ensure_python_base(engine, progress)
    folder = build_cache_root(os.environ) / "image"
    log_path = folder / f"build-{FILE_UNSAFE.sub('_', tag)}.log"
    record_path = folder / f"stages-{FILE_UNSAFE.sub('_', tag)}.json"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    progress(f"guardedcron: docker build of {tag} (log: {log_path})")
    run_long_step(
        engine.command("build", "--force-rm", "--network", "host", "--build-arg", f"PYTHON_IMAGE={base}",
                       "--tag", tag, "--file", str(dockerfile), str(context)),
        what=f"docker build of {tag}",
        log_path=log_path,
        timeout_s=BUILD_TIMEOUT_S,
        progress=progress,
        # The classic builder: Debian's engine 20.10 has no buildx plugin beside it.
        env=engine.env({"DOCKER_BUILDKIT": "0"}),
    )
    built = inspect_image(engine, tag, base)
    remove_replaced_stages(engine, record_path, stage_results(log_path.read_text(errors="replace")))
    return built


def stage_results(build_output: str) -> list[str]:
    """The image each stage ended with, in order, read from the classic builder's output
    (each step ends with ' ---> <id>'; a stage ends where the next FROM begins)."""
    results: list[str] = []
    last = ""
    for line in build_output.splitlines():
        if STAGE_START.match(line) and last:
            results.append(last)
        elif match := STEP_RESULT.match(line):
            last = match.group(1)
    if last:
        results.append(last)
    return results


def remove_replaced_stages(engine: DockerEngine, record_path: Path, current: list[str]) -> None:
    """Remove what this tag's previous build left untagged: its final image and the builder
    stage's image (kept by Docker as the layer cache, useless once the sources changed).
    Only untagged images go, and only if unused (rmi refuses otherwise; that is fine)."""
    try:
        previous = [str(image) for image in json.loads(record_path.read_text())]
    except (OSError, ValueError, TypeError):
        previous = []
    for image in previous:
        if image in current:
            continue
        tags = engine.run("image", "inspect", "--format", "{{len .RepoTags}}", image).stdout.strip()
        if tags == "0":
            engine.run("image", "rm", image)
    record_path.write_text(json.dumps(current) + "\n")


def inspect_image(engine: DockerEngine, tag: str, base: str) -> BuiltImage:
    image_id, size = engine.check("image", "inspect", "--format", "{{.Id}} {{.Size}}", tag).split()
    history = engine.check(
        "history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", tag
    )
    layers = (line.partition("\t") for line in history.splitlines())
    venv_layers = [int(size_text) for size_text, _, created_by in layers if VENV_COPY.search(created_by)]
    if len(venv_layers) != 1:
        raise BuildError(
            f"{tag}: expected one layer copying {VENV_DIR}, found {len(venv_layers)}:\n{history}"
        )
    return BuiltImage(tag, image_id, base, int(size), venv_layers[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m guardedcron_devenv.image",
        description="Build the guardedcron image with a local Docker engine and a stand-in base.",
    )
    parser.add_argument("--tag", default=default_tag(), help="image name:tag (default: %(default)s)")
    parser.add_argument("--context", type=Path, default=Path.cwd(),
                        help="the repository folder holding the Dockerfile (default: the current one)")
    args = parser.parse_args(argv)
    try:
        built = ensure_image(args.tag, args.context.resolve())
    except (BuildError, EngineError) as error:
        print(f"guardedcron: image not built: {error}", file=sys.stderr)
        return 1
    print(f"guardedcron: built {built.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
