"""`guardedcron render`, run as the real command: golden output for every example, and
exit 64 with every reason (and nothing on stdout) for invalid input."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.gcj import README_EXAMPLE

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"
GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))

GCJ = README_EXAMPLE

CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: b}
"""


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def documents(self) -> list[Any]:
        return list(yaml.safe_load_all(self.stdout))


def render(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> Result:
    # The operator settings come from the environment: start from none of ours.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GUARDEDCRON_")}
    environment.update(env or {})
    proc = subprocess.run([GUARDEDCRON, "render", *args], input=stdin, capture_output=True,
                          text=True, env=environment, timeout=60, check=False)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def edited(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


# --- golden output for every example ---------------------------------------------------
def test_there_are_examples() -> None:
    assert EXAMPLE_FILES, f"no examples in {EXAMPLES}"


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_renders_as_its_golden_file(example: Path, update_golden: bool) -> None:
    result = render("-f", str(example))
    assert (result.code, result.stderr) == (0, "")
    golden = GOLDEN / example.name
    if update_golden:
        golden.write_text(result.stdout)
    assert golden.exists(), (f"no golden file {golden.relative_to(REPO)}; review the output "
                             "and create it with --update-golden")
    assert result.stdout == golden.read_text()
    for cronjob in result.documents:
        kubernetes_validate.validate(cronjob, "1.34.0", strict=True)


def test_no_golden_file_without_its_example() -> None:
    orphans = {p.name for p in GOLDEN.glob("*.yaml")} - {p.name for p in EXAMPLE_FILES}
    assert not orphans


# --- successful renders ---------------------------------------------------------------
def test_stdin_with_several_documents_in_order() -> None:
    second = edited(GCJ, ("nightly-invoices", "hourly-sync"), ('"30 2 * * *"', "'@hourly'"))
    result = render("-f", "-", stdin=f"{GCJ}---\n{CONFIG_MAP}---\n{second}---\n")
    assert (result.code, result.stderr) == (0, "")
    cronjobs = result.documents
    assert [(c["kind"], c["metadata"]["name"]) for c in cronjobs] == [
        ("CronJob", "nightly-invoices"), ("CronJob", "hourly-sync")]
    assert result.stdout.startswith("---\n")


def test_several_files_in_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(edited(GCJ, ("nightly-invoices", "first")))
    second.write_text(edited(GCJ, ("nightly-invoices", "second")))
    result = render("-f", str(second), "--filename", str(first))
    assert [c["metadata"]["name"] for c in result.documents] == ["second", "first"]


def test_same_input_gives_identical_bytes() -> None:
    runs = {render("-f", "-", stdin=GCJ).stdout for _ in range(2)}
    assert len(runs) == 1 and runs != {""}


def test_manifest_without_uid_renders_without_owner_reference() -> None:
    (cronjob,) = render("-f", "-", stdin=GCJ).documents
    assert "ownerReferences" not in cronjob["metadata"]


def test_manifest_with_uid_renders_the_owner_reference() -> None:
    uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    text = edited(GCJ, ("namespace: billing}", f"namespace: billing, uid: {uid}}}"))
    (cronjob,) = render("-f", "-", stdin=text).documents
    assert cronjob["metadata"]["ownerReferences"] == [{
        "apiVersion": "guardedcron.io/v1alpha1", "kind": "GuardedCronJob",
        "name": "nightly-invoices", "uid": uid, "controller": True, "blockOwnerDeletion": True}]


def test_namespace_for_manifests_without_one() -> None:
    text = edited(GCJ, (", namespace: billing", ""))
    (default,) = render("-f", "-", stdin=text).documents
    (chosen,) = render("-f", "-", "-n", "ops", stdin=text).documents
    assert default["metadata"]["namespace"] == "default"
    assert chosen["metadata"]["annotations"] == {"guardedcron.io/lock": "ops/nightly-invoices"}


def test_settings_come_from_the_environment() -> None:
    (cronjob,) = render("-f", "-", stdin=GCJ, env={
        "GUARDEDCRON_CLUSTER_NAME": "eu-1", "GUARDEDCRON_GUARD_IMAGE": "reg.local/gc:dev",
    }).documents
    guard = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]
    assert guard["image"] == "reg.local/gc:dev"
    holder = next(e["value"] for e in guard["env"] if e["name"] == "GUARDEDCRON_HOLDER")
    assert holder.startswith("eu-1/")


def test_crd_file_from_the_environment(tmp_path: Path) -> None:
    crd = tmp_path / "crd.yaml"
    crd.write_text((REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml").read_text())
    result = render("-f", "-", stdin=GCJ, env={"GUARDEDCRON_CRD": str(crd)})
    assert result.code == 0
    crd.write_text(CONFIG_MAP)
    result = render("-f", "-", stdin=GCJ, env={"GUARDEDCRON_CRD": str(crd)})
    assert result.code == 64
    assert f"CRD file {crd}: not a CustomResourceDefinition" in result.stderr


# --- invalid input: exit 64, every reason, nothing on stdout ---------------------------
@pytest.mark.parametrize(("edits", "reasons"), [
    pytest.param([('"30 2 * * *"', '"61 * * * *"')],
                 ["-, document 1 (nightly-invoices): spec.schedule: '61 * * * *' is not a valid "
                  "cron schedule"], id="schedule-61"),
    pytest.param([("Europe/Stockholm", "Europe/Atlantis")],
                 [("-, document 1 (nightly-invoices): spec.timeZone: ", "'Europe/Atlantis'")],
                 id="unknown-time-zone"),
    pytest.param([('"30 2 * * *"', '"TZ=UTC 30 2 * * *"')],
                 ["spec.schedule: 'TZ=UTC 30 2 * * *' is not a valid cron schedule: "],
                 id="schedule-with-TZ"),
    pytest.param([("template:\n        spec:", "template:\n        spec:\n          initContainers: "
                   "[{name: guardedcron-guard, image: x}]")],
                 ["spec.jobTemplate.spec.template.spec.initContainers[0].name: "
                  "'guardedcron-guard' is reserved"], id="reserved-init-container"),
    pytest.param([("template:\n        spec:", "template:\n        spec:\n          volumes: "
                   "[{name: guardedcron-run, emptyDir: {}}]")],
                 ["spec.jobTemplate.spec.template.spec.volumes[0].name: 'guardedcron-run' is "
                  "reserved"], id="reserved-volume"),
    pytest.param([('"30 2 * * *"', '"61 * * * *"'), ("Europe/Stockholm", "Europe/Atlantis"),
                  ("databaseSecretRef: {name: jobs-db, key: dsn}",
                   "databaseSecretRef: {name: jobs-db, key: dsn}\n    heartbeat: false")],
                 ["spec.schedule:", "spec.timeZone:", "spec.lease.durationSeconds: must exceed "
                  "spec.activeDeadlineSeconds (3600) when spec.lease.heartbeat is false, not 60"],
                 id="three-at-once"),
    pytest.param([("databaseSecretRef: {name: jobs-db, key: dsn}",
                   "databaseSecretRef: {name: jobs-db, key: dsn}\n    durationSeconds: 1000000000000")],
                 ["-, document 1 (nightly-invoices): spec.lease.durationSeconds: must be at most "
                  "604800 (7 days), not 1000000000000: a run whose pod dies unseen keeps the job "
                  "locked"], id="lease-of-31700-years"),
])
def test_invalid_input_exits_64_with_every_reason(edits: list[tuple[str, str]],
                                                   reasons: list[str | tuple[str, ...]]) -> None:
    """One stderr line per reason, in order; a tuple lists the pieces one line must hold."""
    result = render("-f", "-", stdin=edited(GCJ, *edits))
    assert (result.code, result.stdout) == (64, "")
    lines = result.stderr.splitlines()
    assert len(lines) == len(reasons), result.stderr
    for line, reason in zip(lines, reasons, strict=True):
        assert line.startswith("guardedcron render: ")
        for piece in (reason,) if isinstance(reason, str) else reason:
            assert piece in line


def test_one_bad_document_prints_nothing_at_all(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GCJ)
    bad.write_text(f"{CONFIG_MAP}---\n{edited(GCJ, ('1.42', '1.43'), ('30 2', '30 25'))}")
    result = render("-f", str(good), "-f", str(bad))
    assert (result.code, result.stdout) == (64, "")
    assert result.stderr.startswith(f"guardedcron render: {bad}, document 2 (nightly-invoices): "
                                    "spec.schedule: '30 25 * * *'")


@pytest.mark.parametrize(("args", "stdin", "env", "reason"), [
    pytest.param(["-f", "-"], "a: [1,\n", {}, "-: not valid YAML", id="bad-yaml"),
    pytest.param(["-f", "/nonexistent/gcj.yaml"], "", {},
                 "/nonexistent/gcj.yaml: cannot read: No such file or directory",
                 id="missing-file"),
    pytest.param(["-f", "-"], CONFIG_MAP, {}, "no GuardedCronJob in -", id="no-guardedcronjob"),
    pytest.param(["-f", "-"], "- just\n- a list\n", {},
                 "-, document 1: must be a YAML mapping", id="not-a-mapping"),
    pytest.param(["-f", "-", "-f", "-"], GCJ, {}, "'-' (standard input) can be given only once",
                 id="stdin-twice"),
    pytest.param(["-f", "-"], GCJ, {"GUARDEDCRON_GUARD_IMAGE_PULL_POLICY": "Sometimes"},
                 "setting GUARDEDCRON_GUARD_IMAGE_PULL_POLICY: must be one of", id="bad-setting"),
    pytest.param(["-f", "-", "--crd", "/nonexistent/crd.yaml"], GCJ, {},
                 "CRD file /nonexistent/crd.yaml: cannot read", id="missing-crd"),
    pytest.param(["-f", "-"], edited(GCJ, ("v1alpha1", "v1beta1")), {},
                 "apiVersion: must be guardedcron.io/v1alpha1", id="other-version"),
])
def test_unusable_input_exits_64(args: list[str], stdin: str, env: dict[str, str],
                                 reason: str) -> None:
    result = render(*args, stdin=stdin, env=env)
    assert (result.code, result.stdout) == (64, "")
    assert reason in result.stderr


def test_usage_errors_exit_64() -> None:
    assert render().code == 64  # -f is required
    assert render("-f", "-", "--no-such-option").code == 64


def test_the_package_carries_the_crd_from_crds() -> None:
    # render needs the CRD's defaults wherever guardedcron is installed: the package links
    # to crds/ (pyproject's package-data puts the file into the wheel), never a copy.
    link = REPO / "operator" / "guardedcron" / "crds"
    assert link.is_symlink()
    assert link.resolve() == (REPO / "crds").resolve()
