"""rhysd's `actionlint`, built from its Go module, to lint the GitHub Actions workflows.

.github/workflows/release.yml runs only when a `v*` tag is pushed, so nothing else would
notice a misspelt key, an expression naming an undefined job output or step, or an
action's input that does not exist before a release fails half-published. actionlint is
the `cmd/actionlint` package of the Go module github.com/rhysd/actionlint; our tiny
module in `go/actionlint/` pins one release (a `tool` directive in its go.mod), built
once per version and source digest like promtool (binaries.py's GoTool) into

    ${XDG_CACHE_HOME:-~/.cache}/guardedcron/actionlint-<version>/bin/actionlint

    python -m guardedcron_devenv.actionlint actionlint    # prints the path, building first if needed
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from guardedcron_devenv.binaries import BuildTarget, GoTool, Progress, ensure_go_tool, go_tool_main

ACTIONLINT_MODULE: Final = "github.com/rhysd/actionlint"
ACTIONLINT: Final = GoTool(
    BuildTarget("actionlint", "actionlint", f"{ACTIONLINT_MODULE}/cmd/actionlint"),
    ACTIONLINT_MODULE, "actionlint", "actionlint module",
)


def ensure_actionlint(progress: Progress = print) -> Path:
    """Return the cached actionlint, building it first if absent, stale or forced."""
    return ensure_go_tool(ACTIONLINT, progress)


if __name__ == "__main__":
    go_tool_main(ACTIONLINT)
