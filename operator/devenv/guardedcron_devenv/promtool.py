"""Prometheus' own `promtool`, built from its Go module, for the chart's rule tests.

The chart's alerts and dashboard queries are checked by the rule engine Prometheus
runs (`promtool test rules`, `promtool check rules`), not by a re-implementation. No
package registry here ships promtool, but it is the `cmd/promtool` package of the Go
module github.com/prometheus/prometheus. Our tiny module in `go/promtool/` pins one
release (a `tool` directive in its go.mod); it is built once per version and source
digest, with the same cache protocol and build loop as the control plane and the other
Go-built tools (binaries.py's GoTool), into

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/promtool-<version>/bin/promtool

    python -m guardedcron_devenv.promtool promtool    # prints the path, building first if needed
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import (
    BuildTarget,
    GoTool,
    Progress,
    ensure_go_tool,
    go_tool_main,
    go_tool_stamp,
    go_tool_version,
)

PROMETHEUS_MODULE: Final = "github.com/prometheus/prometheus"
# remove_all_sd leaves out the service-discovery plugins (cloud SDKs, client-go): rule
# tests discover nothing, and without them the cold build compiles a fraction as much.
PROMTOOL: Final = BuildTarget(
    "promtool", "promtool", f"{PROMETHEUS_MODULE}/cmd/promtool", tags=("remove_all_sd",)
)
PROMTOOL_TOOL: Final = GoTool(PROMTOOL, PROMETHEUS_MODULE, "prometheus", "Prometheus module")
PROMTOOL_SOURCES: Final = PROMTOOL_TOOL.sources


def prometheus_version() -> str:
    """The Prometheus module release our go.mod pins (v0.3xx.y is Prometheus 3.xx.y)."""
    return go_tool_version(PROMTOOL_TOOL)


def build_stamp(sources: str, version: str) -> dict[str, str]:
    """What a build is keyed on: a change to any value makes the cached binary stale."""
    return go_tool_stamp(PROMTOOL_TOOL, sources, version)


def ensure_promtool(progress: Progress = print) -> Path:
    """Return the cached promtool, building it first if absent, stale or forced."""
    return ensure_go_tool(PROMTOOL_TOOL, progress)


def main(argv: list[str] | None = None) -> None:
    """`python -m guardedcron_devenv.promtool promtool`: build (or reuse), print the path."""
    go_tool_main(PROMTOOL_TOOL, argv)


if __name__ == "__main__":
    main()
