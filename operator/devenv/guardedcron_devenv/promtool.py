"""Prometheus' own `promtool`, built from its Go module, for the chart's rule tests.

The chart's alerts and dashboard queries are checked by the rule engine Prometheus
runs (`promtool test rules`, `promtool check rules`), not by a re-implementation. No
package registry here ships promtool, but it is the `cmd/promtool` package of the Go
module github.com/prometheus/prometheus. Our tiny module in `go/promtool/` pins one
release (a `tool` directive in its go.mod); it is built once per version and source
digest, with the same cache protocol and build loop as the control plane
(binaries.py), into

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/promtool-<version>/bin/promtool

    python -m guardedcron_devenv.promtool promtool    # prints the path, building first if needed
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import (
    GO_SOURCES,
    BuildError,
    BuildTarget,
    Progress,
    binaries_current,
    build_cache_root,
    build_cached,
    build_go_command,
    build_targets,
    required_version,
    sources_digest,
)

PROMETHEUS_MODULE: Final = "github.com/prometheus/prometheus"
# remove_all_sd leaves out the service-discovery plugins (cloud SDKs, client-go): rule
# tests discover nothing, and without them the cold build compiles a fraction as much.
PROMTOOL: Final = BuildTarget(
    "promtool", "promtool", f"{PROMETHEUS_MODULE}/cmd/promtool", tags=("remove_all_sd",)
)
PROMTOOL_SOURCES: Final = GO_SOURCES / PROMTOOL.module_dir


def prometheus_version() -> str:
    """The Prometheus module release our go.mod pins (v0.3xx.y is Prometheus 3.xx.y)."""
    return required_version((PROMTOOL_SOURCES / "go.mod").read_text(), PROMETHEUS_MODULE)


def build_stamp(sources: str, version: str) -> dict[str, str]:
    """What a build is keyed on: a change to any value makes the cached binary stale."""
    return {
        "prometheus": version,
        "sources": sources,
        "command": " ".join(build_go_command(PROMTOOL, Path("bin"), version)),
    }


def ensure_promtool(progress: Progress = print) -> Path:
    """Return the cached promtool, building it first if absent, stale or forced."""
    version = prometheus_version()
    cache_root = build_cache_root(os.environ)
    version_dir = cache_root / f"promtool-{version}"
    bin_dir = version_dir / "bin"
    build_cached(
        version_dir,
        lambda: build_stamp(sources_digest(only=(f"{PROMTOOL.module_dir}/",)), version),
        lambda wanted: binaries_current(bin_dir, (PROMTOOL,), wanted),
        lambda: _build(bin_dir, version, cache_root, progress),
    )
    return bin_dir / PROMTOOL.name


def _build(bin_dir: Path, version: str, cache_root: Path, progress: Progress) -> None:
    # Checked here so the message names promtool rather than a Kubernetes release.
    if shutil.which("go") is None:
        raise BuildError(
            f"the Go toolchain ('go') is not on PATH; it is needed once to build promtool "
            f"(Prometheus module {version})"
        )
    build_targets((PROMTOOL,), bin_dir, version, cache_root, progress)


def main(argv: list[str] | None = None) -> None:
    """`python -m guardedcron_devenv.promtool promtool`: build (or reuse), print the path."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["promtool"]:
        raise SystemExit("usage: python -m guardedcron_devenv.promtool promtool")
    # Progress goes to stderr so stdout is the path alone, usable as $(...).
    print(ensure_promtool(lambda line: print(line, file=sys.stderr)))


if __name__ == "__main__":
    main()
