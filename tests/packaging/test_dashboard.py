"""The chart's Grafana dashboard: every panel query parses in Prometheus' own parser
(promtool, through a generated rule file) and uses only series and labels the operator
exports; the optional ConfigMap carries it with the sidecar's label."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser

from tests.support.chart import CHART, RELEASE_NAMESPACE, by_kind, one, render
from tests.support.prometheus import exported_series, promtool, selectors, write_rule_file

DASHBOARD = CHART / "files" / "dashboards" / "guardedcron.json"
# Grafana's variables, replaced by values of their kind so Prometheus can parse the query.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
    "$namespace": ".*", "$job": ".*",
}
ENABLED = {"metrics": {"dashboard": {"enabled": True}}}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables filled in) for every target."""
    queries = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: unknown Grafana variable in {expr}"
            queries.append((panel["title"], expr))
    return queries


def check_as_rules(promtool_binary: Path, queries: list[tuple[str, str]],
                   directory: Path) -> tuple[int, str]:
    """promtool has no command that parses a bare expression; a recording rule per query
    makes `promtool check rules` parse each one with Prometheus' own parser."""
    rules = [{"record": f"guardedcron:dashboard_query:{index}", "expr": expr}
             for index, (_, expr) in enumerate(queries)]
    rule_file = write_rule_file(directory / "dashboard-queries.yaml",
                                [{"name": "dashboard", "rules": rules}])
    result = promtool(promtool_binary, ["check", "rules", str(rule_file)], directory)
    return result.code, result.output


def test_every_panel_query_parses_in_promtool(tmp_path: Path, promtool_binary: Path) -> None:
    queries = panel_queries(dashboard())
    assert len(queries) >= 10
    code, output = check_as_rules(promtool_binary, queries, tmp_path)
    assert code == 0, output
    assert f"SUCCESS: {len(queries)} rules found" in output, output


def test_the_promtool_check_catches_a_broken_query(tmp_path: Path, promtool_binary: Path) -> None:
    code, output = check_as_rules(
        promtool_binary, [("broken", "sum by (name (guardedcron_runs_total)")], tmp_path)
    assert code != 0
    assert "parse error" in output, output


def test_panels_use_only_what_the_operator_exports() -> None:
    exported = exported_series()
    for title, expr in panel_queries(dashboard()):
        used = selectors(promql_parser.parse(expr))
        assert used, title
        for selector in used:
            assert selector.name in exported, f"{title}: {selector.name} is not exported"
            for matcher in selector.matchers.matchers:
                assert matcher.name in exported[selector.name], (title, matcher.name)
        for grouping in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert labels <= set().union(*(exported[s.name] for s in used)), (title, labels)


def test_variables_list_only_exported_series() -> None:
    exported = exported_series()
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        series, label = re.fullmatch(r"label_values\((\w+)(?:\{.*\})?, (\w+)\)",
                                     variable["definition"]).groups()  # type: ignore[union-attr]
        assert label in exported[series], variable["name"]


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    """Runs by outcome per job, missed runs, overlaps, lease holders (skipped: another
    holder had it) and fences (lease_lost), time since the last success."""
    exprs = " ".join(expr for _, expr in panel_queries(dashboard()))
    assert "sum by (namespace, name, outcome) (increase(guardedcron_runs_total" in exprs
    for needed in ("guardedcron_missed_runs_total", "guardedcron_overlaps_total",
                   'outcome="skipped"', 'outcome="lease_lost"', 'outcome="guard_error"',
                   "time() - max by (namespace, name) (guardedcron_last_success_timestamp_seconds"):
        assert needed in exprs, needed
    uids = {panel["datasource"]["uid"] for panel in dashboard()["panels"]}
    assert uids == {"${datasource}"}, "every panel reads the chosen Prometheus data source"


def test_the_dashboard_shows_the_operators_health_and_jobs_that_cannot_run() -> None:
    """The operator's pods by version, their CPU and memory (process_* of guardedcron's
    targets only: joined with guardedcron_build_info on the scrape target), and the
    GuardedCronJobs the Invalid, Stalled and NeverSucceeded alerts are about."""
    queries = panel_queries(dashboard())
    exprs = " ".join(expr for _, expr in queries)
    for needed in ("count by (version) (guardedcron_build_info)", "rate(process_cpu_seconds_total",
                   "process_resident_memory_bytes", "guardedcron_condition{",
                   "guardedcron_failed_runs_before_first_success{"):
        assert needed in exprs, needed
    for title, expr in queries:
        if "process_" in expr:
            assert expr.endswith("* on (job, instance) group_left (version) guardedcron_build_info"), title


def test_the_optional_configmap_carries_the_dashboard_with_the_sidecar_label() -> None:
    assert not by_kind(render(), "ConfigMap"), "off by default"
    config_map = one(render(ENABLED), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert json.loads(config_map["data"]["guardedcron.json"]) == dashboard()


def test_the_configmap_namespace_and_annotations_come_from_values() -> None:
    config_map = one(render({"metrics": {"dashboard": {
        "enabled": True, "namespace": "monitoring",
        "labels": {"grafana_dashboard": "guardedcron"},
        "annotations": {"grafana_folder": "Operators"},
    }}}), "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "guardedcron"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Operators"}
