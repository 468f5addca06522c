"""Nothing changes for a GuardedCronJob that uses none of issue 14's fields: the examples
that existed before them render, byte for byte, the CronJobs rendered before them.

The expected files (tests/unit/unchanged_renders/) were written once from commit 340bda1
and, unlike tests/unit/golden/, have no update switch: a change here is a change for
every user who upgrades. The one change since then is a fix, not a feature, and is named
here: the keeper's startupProbe (the workload waits until SIGTERM would make the keeper
release the lease), taken out of the render before it is compared; everything else must
match byte for byte.

The CRD's lease defaults changed since (a keeper by default: `heartbeat` true, a 60 s
lease). An object admitted before that was stored with the defaults of its day
(`heartbeat: false`, `durationSeconds: 3900`), and the API server keeps them, so each
example is rendered as the object it was admitted as: with those values filled in where
it leaves them out. Such an object renders exactly as before the change.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.unit.test_render import EXAMPLES, render

FROZEN = Path(__file__).resolve().parent / "unchanged_renders"
FROZEN_FILES = sorted(FROZEN.glob("*.yaml"))
# The keeper's startupProbe block in render's YAML: the key and the lines indented below it.
KEEPER_STARTUP_PROBE = re.compile(r"^( +)startupProbe:\n(?:\1 .*\n)+", re.MULTILINE)


def without_keeper_startup_probe(rendered: str) -> str:
    found = KEEPER_STARTUP_PROBE.findall(rendered)
    assert len(found) == rendered.count("name: guardedcron-keeper\n"), "one probe per keeper"
    return KEEPER_STARTUP_PROBE.sub("", rendered)


def test_every_old_example_is_still_there() -> None:
    assert [path.name for path in FROZEN_FILES] == [
        "every-5-minutes-sync.yaml", "heartbeat.yaml", "nightly-invoices.yaml",
        "shared-lock-across-namespaces.yaml", "shared-lock-multicluster.yaml",
    ]
    for frozen in FROZEN_FILES:
        assert (EXAMPLES / frozen.name).exists(), f"example {frozen.name} was removed"


# What the CRD defaulted a lease to before the keeper became the default.
ADMITTED_LEASE_DEFAULTS = {"heartbeat": False, "durationSeconds": 3900}


def as_admitted_before(example: Path) -> str:
    """The example as the API server stored it when the old lease defaults applied."""
    documents = list(yaml.safe_load_all(example.read_text()))
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "GuardedCronJob":
            lease = document["spec"]["lease"]
            for key, value in ADMITTED_LEASE_DEFAULTS.items():
                lease.setdefault(key, value)
    return yaml.safe_dump_all(documents, sort_keys=False)


@pytest.mark.parametrize("frozen", FROZEN_FILES, ids=lambda path: path.stem)
def test_old_example_renders_the_same_bytes_as_before(frozen: Path) -> None:
    result = render("-f", "-", stdin=as_admitted_before(EXAMPLES / frozen.name))
    assert result.code == 0, result.stderr
    assert without_keeper_startup_probe(result.stdout) == frozen.read_text()
