"""The chart's alerts parse as PromQL and use only the metrics of docs/design.md."""

from __future__ import annotations

import re
from typing import Any

import promql_parser
import pytest
import yaml

from tests.support import REPO
from tests.support.chart import CHART, one, render
from tests.support.prometheus import exported_series, selectors

ALERTS = {
    "GuardedCronJobMissedRun", "GuardedCronJobSlotNotStarted", "GuardedCronJobOverlap",
    "GuardedCronJobNoRecentSuccess", "GuardedCronJobGuardErrors", "GuardedCronOperatorReconcileErrors",
    "GuardedCronOperatorDown", "GuardedCronJobInvalid", "GuardedCronJobStalled",
    "GuardedCronJobNeverSucceeded",
}
# Labels the scrape gives a series that does not carry them itself (tests/support/prometheus.py,
# operator_target_labels): how GuardedCronOperatorDown picks this release's operator.
SCRAPE_LABELS = {"job", "namespace"}
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def documented_metrics() -> dict[str, set[str]]:
    """name -> labels, from the table under '### Metrics' in docs/design.md."""
    design = (REPO / "docs" / "design.md").read_text()
    section = design.split("### Metrics", 1)[1].split("\n#", 1)[0]
    metrics = {}
    for name, labels in re.findall(r"^\| `(guardedcron_\w+)` \| \w+ \| ([^|]*) \|", section,
                                   flags=re.MULTILINE):
        metrics[name] = {label.strip() for label in labels.split(",") if "(" not in label}
    return metrics


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    rule = one(render({"metrics": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return list(group["rules"])


def test_the_documented_metrics_table_is_found() -> None:
    metrics = documented_metrics()
    assert "guardedcron_runs_total" in metrics
    assert metrics["guardedcron_runs_total"] == {"namespace", "name", "outcome"}


def test_every_alert_is_there(rules: list[dict[str, Any]]) -> None:
    assert {rule["alert"] for rule in rules} == ALERTS


def test_expressions_parse_and_use_documented_metrics_and_labels(
    rules: list[dict[str, Any]],
) -> None:
    metrics = documented_metrics()
    for rule in rules:
        expr = promql_parser.parse(rule["expr"])
        used = selectors(expr)
        assert used, rule["alert"]
        for selector in used:
            name = selector.name if selector.name in metrics else HISTOGRAM_SERIES.sub("", selector.name)
            assert name in metrics, f"{rule['alert']}: {selector.name} is not documented"
            for matcher in selector.matchers.matchers:
                assert matcher.name in metrics[name] | SCRAPE_LABELS, (rule["alert"], matcher.name)
        for label in re.findall(r"\$labels\.(\w+)", str(rule["annotations"])):
            assert all(label in metrics[HISTOGRAM_SERIES.sub("", s.name)] for s in used), \
                (rule["alert"], label)
        assert rule["labels"]["severity"] in ("info", "warning", "critical")


def test_a_broken_expression_is_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("increase(guardedcron_overlaps_total[1h) > 0")


def test_thresholds_come_from_values() -> None:
    objects = render({"metrics": {"prometheusRule": {
        "enabled": True, "noSuccessSlots": 5, "window": "6h",
        "severity": {"overlap": "warning", "operatorDown": "warning"},
    }}})
    by_name = {r["alert"]: r for r in one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]}
    # The operator counts the slots (on the real schedule), so the count goes to it.
    env = {e["name"]: e.get("value")
           for e in one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GUARDEDCRON_NO_SUCCESS_SLOTS"] == "5"
    assert "5 slots in a row" in by_name["GuardedCronJobNoRecentSuccess"]["annotations"]["summary"]
    assert by_name["GuardedCronOperatorDown"]["labels"]["severity"] == "warning"
    assert "[6h]" in by_name["GuardedCronJobOverlap"]["expr"]
    assert by_name["GuardedCronJobOverlap"]["labels"]["severity"] == "warning"


def test_alerts_match_what_the_operator_exports(rules: list[dict[str, Any]]) -> None:
    """Names, label names and outcome values as the operator's registry has them."""
    from guardedcron.observability.metrics import OUTCOME_LABELS

    exported = exported_series()
    for rule in rules:
        for selector in selectors(promql_parser.parse(rule["expr"])):
            assert selector.name in exported, (rule["alert"], selector.name)
            for matcher in selector.matchers.matchers:
                assert matcher.name in exported[selector.name] | SCRAPE_LABELS
                if matcher.name == "outcome":
                    assert matcher.value in OUTCOME_LABELS.values(), matcher.value


RUNBOOKS = REPO / "docs" / "runbooks.md"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but hyphens and
    underscores dropped, spaces as hyphens (outside fenced code, where # is a comment)."""
    anchors = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_every_alert_links_its_own_section_of_the_runbooks(rules: list[dict[str, Any]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    page = values["metrics"]["prometheusRule"]["runbookUrl"]
    assert page.endswith("/docs/runbooks.md"), page
    anchors = github_anchors(RUNBOOKS.read_text())
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url == f"{page}#{rule['alert'].lower()}", (rule["alert"], url)
        assert url.split("#", 1)[1] in anchors, f"docs/runbooks.md has no section for {rule['alert']}"


def test_the_runbooks_page_has_a_section_for_each_alert_and_no_other() -> None:
    sections = re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    assert sorted(sections) == sorted(ALERTS)
    assert len(sections) == len(set(sections))


def test_the_runbook_page_comes_from_values() -> None:
    rule = one(render({"metrics": {"prometheusRule": {
        "enabled": True, "runbookUrl": "https://wiki.example/ops/guardedcron"}}}), "PrometheusRule")
    urls = {r["alert"]: r["annotations"]["runbook_url"] for r in rule["spec"]["groups"][0]["rules"]}
    assert urls["GuardedCronJobInvalid"] == "https://wiki.example/ops/guardedcron#guardedcronjobinvalid"
    assert all(url.startswith("https://wiki.example/ops/guardedcron#") for url in urls.values())
