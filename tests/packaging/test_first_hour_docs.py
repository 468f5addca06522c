"""What a newcomer reads in the first hour says the right things: the required versions
(checked against what the chart and the test suite pin), the image in the Helm command,
the DST behaviour next to the Stockholm example, and the database steps in NOTES.txt."""

from __future__ import annotations

import re

import yaml

from guardedcron_devenv.binaries import pinned_versions
from guardedcron_devenv.postgres import find_server_bin
from tests.support import REPO
from tests.support.chart import CHART, RELEASE_NAMESPACE, helm

README = REPO / "README.md"
DESIGN = REPO / "docs" / "design.md"


def section(text: str, heading: str) -> str:
    """The body of a Markdown section, up to the next heading of any level."""
    start = text.index(heading + "\n") + len(heading) + 1
    following = re.search(r"^#{1,6} ", text[start:], flags=re.MULTILINE)
    return text[start:start + following.start()] if following else text[start:]


def test_readme_states_the_kubernetes_versions_the_chart_and_tests_use() -> None:
    requirements = section(README.read_text(), "### Requirements")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    minimum = re.fullmatch(r">=(\d+\.\d+)\.0-0", chart["kubeVersion"])
    assert minimum, chart["kubeVersion"]
    assert f"**Kubernetes {minimum.group(1)} or newer**" in requirements
    kubernetes, _ = pinned_versions()  # what the e2e control plane is built from
    minor = ".".join(kubernetes.split(".")[:2])
    assert f"**{minor}**" in requirements and f"({kubernetes}," in requirements
    for cel_field in ("`reason`", "`fieldPath`"):
        assert cel_field in requirements
    crd = (REPO / "crds" / "guardedcronjobs.guardedcron.io.yaml").read_text()
    assert "reason: FieldValueInvalid" in crd and "fieldPath: " in crd


def test_readme_states_the_postgresql_version_the_tests_run() -> None:
    requirements = section(README.read_text(), "### Requirements")
    stated = re.search(r"\*\*PostgreSQL (\d+) or newer\*\*: the version the test suite runs "
                       r"\((\d+)\.\d+\)", requirements)
    assert stated, requirements
    assert stated.group(1) == stated.group(2)
    server_bin = find_server_bin()  # the server the suite's fixtures start
    assert server_bin.parent.name == stated.group(1), server_bin


def test_readme_helm_install_sets_the_image() -> None:
    helm_section = section(README.read_text(), "### With Helm")
    command = re.search(r"```sh\n(helm install .*?)```", helm_section, flags=re.DOTALL)
    assert command, helm_section
    assert "--set image.repository=" in command.group(1)
    assert "--set image.tag=" in command.group(1)
    chart_readme = (CHART / "README.md").read_text()
    first = re.search(r"```sh\n(helm install .*?)```", chart_readme, flags=re.DOTALL)
    assert first and "image.repository=" in first.group(1) and "image.tag=" in first.group(1)


def test_dst_behaviour_is_stated_next_to_the_stockholm_example() -> None:
    readme = README.read_text()
    example = readme.index("  timeZone: Europe/Stockholm\n")
    following = readme[example:example + 2500]
    dst = following[following.index("**Daylight saving time.**"):]
    paragraph = dst.split("\n\n", 1)[0]
    assert "`30 2 * * *`" in paragraph
    assert "runs **twice**" in paragraph and "**not run at all**" in paragraph
    assert "October" in paragraph and "March" in paragraph
    assert '"Schedules"' in paragraph
    assert "## Schedules" in DESIGN.read_text()


def test_notes_give_the_database_steps() -> None:
    result = helm(["install", "gc", str(CHART), "--dry-run=client",
                   "--namespace", RELEASE_NAMESPACE],
                  {"image": {"repository": "registry.example/guardedcron", "tag": "1.2.3"}})
    assert result.code == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "guardedcron db migrate" in notes
    assert "--image=registry.example/guardedcron:1.2.3" in notes
    assert "-- db migrate" in notes
    assert "create secret generic jobs-db" in notes
    assert "spec.lease.databaseSecretRef: {name: jobs-db, key: dsn}" in notes
    assert "PostgreSQL 15 or newer" in notes


def test_notes_warn_when_honor_labels_is_off() -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "honorLabels": False}}}
    result = helm(["install", "gc", str(CHART), "--dry-run=client",
                   "--namespace", RELEASE_NAMESPACE], values)
    assert result.code == 0, result.stderr
    assert "exported_namespace" in result.stdout.split("NOTES:", 1)[1]


def test_chart_readme_explains_the_label_choice_and_the_dashboard() -> None:
    chart_readme = (CHART / "README.md").read_text()
    assert "`honorLabels: true`" in chart_readme and "exported_namespace" in chart_readme
    assert "`grafana_dashboard: \"1\"`" in chart_readme
    assert "files/dashboards/guardedcron.json" in chart_readme
