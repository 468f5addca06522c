"""The chart's alerts parse as PromQL and use only the metrics of docs/design.md."""

from __future__ import annotations

import re
from typing import Any

import promql_parser
import pytest

from tests.support import REPO
from tests.support.chart import one, render
from tests.support.prometheus import exported_series, selectors

ALERTS = {
    "GuardedCronJobMissedRun", "GuardedCronJobOverlap", "GuardedCronJobNoRecentSuccess",
    "GuardedCronJobGuardErrors", "GuardedCronOperatorReconcileErrors",
}


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
            assert selector.name in metrics, f"{rule['alert']}: {selector.name} is not documented"
            for matcher in selector.matchers.matchers:
                assert matcher.name in metrics[selector.name], (rule["alert"], matcher.name)
        for label in re.findall(r"\$labels\.(\w+)", str(rule["annotations"])):
            assert all(label in metrics[s.name] for s in used), (rule["alert"], label)
        assert rule["labels"]["severity"] in ("info", "warning", "critical")


def test_a_broken_expression_is_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("increase(guardedcron_overlaps_total[1h) > 0")


def test_thresholds_come_from_values() -> None:
    rule = one(render({"metrics": {"prometheusRule": {
        "enabled": True, "noSuccessPeriods": 5, "window": "6h",
        "severity": {"overlap": "warning"},
    }}}), "PrometheusRule")
    by_name = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    no_success = by_name["GuardedCronJobNoRecentSuccess"]["expr"]
    assert "> 5 * max by (namespace, name) (guardedcron_schedule_period_seconds)" in no_success
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
                assert matcher.name in exported[selector.name]
                if matcher.name == "outcome":
                    assert matcher.value in OUTCOME_LABELS.values(), matcher.value
