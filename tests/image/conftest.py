"""The guardedcron image, built once per session by a real Docker engine (make image's way)."""

from __future__ import annotations

import pytest

from guardedcron_devenv.docker_engine import DockerEngine, ensure_engine
from guardedcron_devenv.image import BuiltImage, default_tag, ensure_image
from tests.support.image import REPO


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """The machine's engine, started if none answers; no engine is an error, never a skip."""
    return ensure_engine()


@pytest.fixture(scope="session")
def built_image(docker_engine: DockerEngine) -> BuiltImage:
    """The repository's Dockerfile built on the stand-in base, tagged as `make image` tags it."""
    return ensure_image(default_tag(), REPO, engine=docker_engine)
