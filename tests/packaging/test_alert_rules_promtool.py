"""Every alert of the chart, evaluated by Prometheus' own rule engine (`promtool test rules`)
over series labelled the way Prometheus stores them when it scrapes the operator through
the chart's ServiceMonitor: each alert fires for the failing GuardedCronJob, names its
namespace (not the operator's), carries what a pager needs, and stays silent for a
healthy one, also across an operator restart (new pod, new series)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.chart import RELEASE_NAMESPACE, one, render
from tests.support.prometheus import (
    operator_target_labels,
    promtool,
    series_selector,
    stored_labels,
    write_rule_file,
)

FAILING = ("billing", "nightly-invoices")
HEALTHY = ("reports", "weekly-sync")
# The operator pod before and after a restart (a new name and address).
POD_A = ("gc-guardedcron-7d9f8-abcde", "10.244.0.17")
POD_B = ("gc-guardedcron-7d9f8-fghij", "10.244.0.23")
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}


@dataclass(frozen=True)
class Exposed:
    """One series as the operator's /metrics exposes it, and its samples (one a minute,
    promtool's expanding notation; `_` is no sample)."""

    metric: str
    job: tuple[str, str]
    values: str
    pod: tuple[str, str] = POD_A
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    alert: str
    series: tuple[Exposed, ...]
    # minute of evaluation -> the value text the description shows, for the failing job;
    # an empty dict (no key) means nothing may fire at that minute.
    fires_at: dict[int, str]
    silent_at: tuple[int, ...]


def counter_scenario(alert: str, metric: str, labels: dict[str, str] | None = None) -> Scenario:
    """A counter the operator creates at its first count (so first scraped at 1): the failing
    job's grows at minute 101, the operator restarts at minute 130 and the new pod counts
    one more at minute 190; the healthy job's counter never moves after it appeared."""
    extra = labels or {}
    return Scenario(
        alert=alert,
        series=(
            Exposed(metric, FAILING, "1x100 2x30", POD_A, extra),
            Exposed(metric, FAILING, "_x190 1x20", POD_B, extra),
            Exposed(metric, HEALTHY, "1x130", POD_A, extra),
        ),
        fires_at={110: "", 200: ""},
        silent_at=(90, 180),
    )


SCENARIOS = (
    counter_scenario("GuardedCronJobMissedRun", "guardedcron_missed_runs_total"),
    counter_scenario("GuardedCronJobOverlap", "guardedcron_overlaps_total"),
    counter_scenario("GuardedCronOperatorReconcileErrors", "guardedcron_reconcile_errors_total"),
    Scenario(
        alert="GuardedCronJobGuardErrors",
        series=(
            Exposed("guardedcron_runs_total", FAILING, "1x100 2x30", POD_A, {"outcome": "guard_error"}),
            Exposed("guardedcron_runs_total", FAILING, "_x190 1x20", POD_B, {"outcome": "guard_error"}),
            Exposed("guardedcron_runs_total", FAILING, "1+1x130", POD_A, {"outcome": "succeeded"}),
            # Runs that succeed, and one that failed in its own code: not the guard's error.
            Exposed("guardedcron_runs_total", HEALTHY, "1+1x130", POD_A, {"outcome": "succeeded"}),
            Exposed("guardedcron_runs_total", HEALTHY, "1x100 2x30", POD_A, {"outcome": "failed"}),
        ),
        fires_at={110: "", 200: ""},
        silent_at=(90, 180),
    ),
    Scenario(
        alert="GuardedCronJobNoRecentSuccess",
        series=(
            # Hourly schedule, last success at second 600: overdue after 2 periods.
            Exposed("guardedcron_last_success_timestamp_seconds", FAILING, "600x160", POD_A),
            Exposed("guardedcron_schedule_period_seconds", FAILING, "3600x160", POD_A),
            # The restarted operator sets the same gauges from the status (both pods up
            # for ten minutes): still one alert.
            Exposed("guardedcron_last_success_timestamp_seconds", FAILING, "_x150 600x50", POD_B),
            Exposed("guardedcron_schedule_period_seconds", FAILING, "_x150 3600x50", POD_B),
            Exposed("guardedcron_last_success_timestamp_seconds", HEALTHY, "0+60x200", POD_A),
            Exposed("guardedcron_schedule_period_seconds", HEALTHY, "3600x200", POD_A),
        ),
        fires_at={155: "2h 25m 0s", 180: "2h 50m 0s"},
        silent_at=(60, 119),
    ),
)

# What the pager shows, written out for the failing job (namespace billing).
SUMMARIES = {
    "GuardedCronJobMissedRun": "GuardedCronJob billing/nightly-invoices missed a scheduled run",
    "GuardedCronJobOverlap": "Two runs of GuardedCronJob billing/nightly-invoices overlapped",
    "GuardedCronJobNoRecentSuccess":
        "GuardedCronJob billing/nightly-invoices has not succeeded for 2 schedule periods",
    "GuardedCronJobGuardErrors": "The guard of GuardedCronJob billing/nightly-invoices failed",
    "GuardedCronOperatorReconcileErrors":
        "The operator fails to reconcile GuardedCronJob billing/nightly-invoices",
}


def chart_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = one(render(values), "PrometheusRule")
    return list(rule["spec"]["groups"])


def stored_series(values: dict[str, Any]) -> list[dict[str, str]]:
    """input_series for promtool: every scenario's series, labelled as Prometheus stores
    them under the ServiceMonitor the chart renders with `values`."""
    objects = render(values)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    honor = bool(monitor["spec"]["endpoints"][0].get("honorLabels", False))
    rows: list[dict[str, str]] = []
    for scenario in SCENARIOS:
        for exposed in scenario.series:
            namespace, name = exposed.job
            labels = {"__name__": exposed.metric, "namespace": namespace, "name": name,
                      **exposed.labels}
            target = operator_target_labels(monitor, service, *exposed.pod)
            rows.append({"series": series_selector(stored_labels(labels, target, honor)),
                         "values": exposed.values})
    return rows


def expected_alert(rule: dict[str, Any], value_text: str) -> dict[str, Any]:
    namespace, name = FAILING
    description = (
        rule["annotations"]["description"]
        .replace("{{ $labels.namespace }}", namespace)
        .replace("{{ $labels.name }}", name)
        .replace("{{ $value | humanizeDuration }}", value_text)
    )
    assert "{{" not in description, description
    return {
        "exp_labels": {"namespace": namespace, "name": name,
                       "severity": rule["labels"]["severity"]},
        "exp_annotations": {"summary": SUMMARIES[rule["alert"]], "description": description},
    }


def rules_test(values: dict[str, Any], directory: Path) -> Path:
    """A rule file from the chart's PrometheusRule and a promtool test file over it."""
    groups = chart_rules(values)
    write_rule_file(directory / "rules.yaml", groups)
    by_alert = {rule["alert"]: rule for group in groups for rule in group["rules"]}
    checks = []
    for scenario in SCENARIOS:
        rule = by_alert[scenario.alert]
        for minute, value_text in scenario.fires_at.items():
            checks.append({"eval_time": f"{minute}m", "alertname": scenario.alert,
                           "exp_alerts": [expected_alert(rule, value_text)]})
        for minute in scenario.silent_at:
            checks.append({"eval_time": f"{minute}m", "alertname": scenario.alert, "exp_alerts": []})
    test_file = directory / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": stored_series(values),
                   "alert_rule_test": checks}],
    }, sort_keys=False))
    return test_file


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    alerts = {rule["alert"] for group in chart_rules(MONITORING) for rule in group["rules"]}
    assert {scenario.alert for scenario in SCENARIOS} == alerts
    assert set(SUMMARIES) == alerts
    for scenario in SCENARIOS:
        assert scenario.fires_at and scenario.silent_at, scenario.alert


def test_promtool_check_rules_accepts_the_chart_rules(tmp_path: Path, promtool_binary: Path) -> None:
    rules = write_rule_file(tmp_path / "rules.yaml", chart_rules(MONITORING))
    result = promtool(promtool_binary, ["check", "rules", str(rules)], tmp_path)
    assert result.code == 0, result.output
    assert "SUCCESS: 5 rules found" in result.output, result.output


def test_alerts_fire_for_the_failing_job_in_its_own_namespace(tmp_path: Path, promtool_binary: Path) -> None:
    test_file = rules_test(MONITORING, tmp_path)
    result = promtool(promtool_binary, ["test", "rules", str(test_file)], tmp_path)
    assert result.code == 0, f"promtool test rules failed:\n{result.output}"
    assert "SUCCESS" in result.output, result.output


def test_the_service_monitor_honors_the_metrics_labels_by_default() -> None:
    monitor = one(render(MONITORING), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_without_honor_labels_the_alerts_name_the_operators_namespace(
    tmp_path: Path, promtool_binary: Path,
) -> None:
    """The clash the chart avoids: Prometheus renames the metrics' namespace label to
    exported_namespace and the alerts point at the operator's namespace; the rule test
    above catches exactly that."""
    values = {"metrics": {**MONITORING["metrics"], "serviceMonitor": {
        "enabled": True, "honorLabels": False}}}
    stored = stored_series(values)
    assert all(f'exported_namespace="{FAILING[0]}"' in row["series"]
               for row in stored if f'name="{FAILING[1]}"' in row["series"])
    test_file = rules_test(values, tmp_path)
    result = promtool(promtool_binary, ["test", "rules", str(test_file)], tmp_path)
    assert result.code != 0, result.output
    assert re.search(rf'namespace="{RELEASE_NAMESPACE}"', result.output), result.output
