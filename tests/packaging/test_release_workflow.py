"""The GitHub Actions workflows, linted by the real actionlint (rhysd/actionlint, built from
its Go module by the `actionlint_binary` fixture of conftest.py).

.github/workflows/release.yml runs only when a `v*` tag is pushed (docs/releasing.md): a
misspelt key, an expression naming an undefined job output, or a `needs` on a job that
does not exist would otherwise be found by the first release that breaks half-published.
actionlint checks the workflow syntax, every `${{ }}` expression against the contexts
and job outputs in scope, `needs`, `runs-on` labels and the inputs of popular actions;
shellcheck (for `run:` scripts) and pyflakes (for `shell: python`) are used when they
are on PATH and left off otherwise, so the check runs the same on a machine without them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from guardedcron_devenv import binaries
from guardedcron_devenv.actionlint import ACTIONLINT
from guardedcron_devenv.binaries import build_cache_root, go_tool_stamp, go_tool_version, sources_digest
from tests.support import REPO

WORKFLOWS = REPO / ".github" / "workflows"
RELEASE_WORKFLOW = WORKFLOWS / "release.yml"
ACTIONLINT_TIMEOUT_S = 60


def actionlint(binary: Path, files: list[Path], cwd: Path) -> tuple[int, list[dict[str, Any]]]:
    """Lint `files` (relative to `cwd`); the exit code and actionlint's errors as JSON."""
    integrations = [f"-{tool}={shutil.which(tool) or ''}" for tool in ("shellcheck", "pyflakes")]
    done = subprocess.run(
        [str(binary), *integrations, "-format", "{{json .}}", *map(str, files)],
        cwd=cwd, capture_output=True, text=True, timeout=ACTIONLINT_TIMEOUT_S, check=False,
    )
    assert done.stderr == "", done.stderr
    return done.returncode, json.loads(done.stdout or "[]")


def test_the_pinned_release_and_its_checksums_are_committed() -> None:
    assert go_tool_version(ACTIONLINT) == "v1.7.12"
    assert "tool github.com/rhysd/actionlint/cmd/actionlint" in (ACTIONLINT.sources / "go.mod").read_text()
    assert "github.com/rhysd/actionlint v1.7.12 h1:" in (ACTIONLINT.sources / "go.sum").read_text()


def test_the_cached_binary_is_keyed_by_version_and_runs(actionlint_binary: Path) -> None:
    version = go_tool_version(ACTIONLINT)
    version_dir = build_cache_root(os.environ) / f"actionlint-{version}"
    assert actionlint_binary == version_dir / "bin" / "actionlint"
    stamp = json.loads((version_dir / binaries.STAMP_FILE).read_text())
    assert stamp == go_tool_stamp(ACTIONLINT, sources_digest(only=("actionlint/",)), version)
    reported = subprocess.run([str(actionlint_binary), "-version"], capture_output=True, text=True,
                              timeout=ACTIONLINT_TIMEOUT_S, check=False)
    assert reported.returncode == 0 and reported.stdout.splitlines()[0] == version


def test_every_workflow_passes_actionlint(actionlint_binary: Path) -> None:
    files = sorted(p.relative_to(REPO) for p in WORKFLOWS.iterdir() if p.suffix in (".yml", ".yaml"))
    assert RELEASE_WORKFLOW.relative_to(REPO) in files
    code, errors = actionlint(actionlint_binary, files, REPO)
    assert (code, errors) == (0, [])


# A deliberate error each: what the workflow says, what the broken copy says instead, the
# text of the line actionlint reports it on (a job's `needs` at the job's key), and
# actionlint's kind and words for the error.
BREAKAGES = {
    "misspelt-key": ("    environment: pypi\n", "    enviroment: pypi\n", "enviroment",
                     "syntax-check", 'unexpected key "enviroment" for "job" section'),
    "undefined-job-output": ("VERSION: ${{ needs.build.outputs.version }}",
                             "VERSION: ${{ needs.build.outputs.versoin }}", "versoin",
                             "expression", 'property "versoin" is not defined'),
    "runs-on-undefined-matrix": ("  build:\n    runs-on: ubuntu-24.04\n",
                                 "  build:\n    runs-on: ${{ matrix.os }}\n", "matrix.os",
                                 "expression", 'property "os" is not defined'),
    "needs-unknown-job": ("needs: [build, pypi, chart, image]",
                          "needs: [build, pypi, chart, images]", "  github-release:",
                          "job-needs", 'needs job "images" which does not exist'),
}


@pytest.mark.parametrize(("original", "broken", "at", "kind", "message"), BREAKAGES.values(),
                         ids=BREAKAGES.keys())
def test_actionlint_fails_a_broken_copy_of_the_release_workflow(
    actionlint_binary: Path, tmp_path: Path,
    original: str, broken: str, at: str, kind: str, message: str,
) -> None:
    text = RELEASE_WORKFLOW.read_text()
    assert text.count(original) == 1, "the workflow changed: update this breakage"
    copy = tmp_path / ".github" / "workflows" / "release.yml"
    copy.parent.mkdir(parents=True)
    copy.write_text(text.replace(original, broken))
    line = next(n for n, content in enumerate(copy.read_text().splitlines(), 1) if at in content)

    code, errors = actionlint(actionlint_binary, [copy.relative_to(tmp_path)], tmp_path)

    assert code == 1
    found = [(e["filepath"], e["line"], e["kind"]) for e in errors if message in e["message"]]
    assert found == [(".github/workflows/release.yml", line, kind)], errors
