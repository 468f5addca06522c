"""Prometheus' side of the chart, for tests: the real promtool, and series labelled the
way Prometheus stores them when it scrapes the operator through the chart's ServiceMonitor."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from guardedcron.observability.metrics import create_metrics, record_changes
from guardedcron.spec import SpecError, parse_guarded_cronjob
from guardedcron.status import compute_status

# promtool checks and rule tests take well under a second.
PROMTOOL_TIMEOUT_S = 60


@dataclass(frozen=True)
class PromtoolResult:
    code: int
    output: str  # stdout and stderr together, as promtool reports to either


def promtool(binary: Path, args: Sequence[str], cwd: Path) -> PromtoolResult:
    """Run the real promtool (tests get `binary` from the `promtool_binary` fixture of
    tests/packaging/conftest.py, which builds it from its Go module before the session's
    tests run; a failed build fails them with go's own output)."""
    done = subprocess.run(
        [str(binary), *args], cwd=cwd, capture_output=True, text=True,
        timeout=PROMTOOL_TIMEOUT_S, check=False,
    )
    return PromtoolResult(done.returncode, done.stdout + done.stderr)


def write_rule_file(path: Path, groups: Sequence[Mapping[str, Any]]) -> Path:
    """A Prometheus rule file (what the Prometheus Operator writes from a PrometheusRule)."""
    path.write_text(yaml.safe_dump({"groups": list(groups)}, sort_keys=False))
    return path


def operator_target_labels(service_monitor: Mapping[str, Any], service: Mapping[str, Any],
                           pod_name: str, pod_ip: str) -> dict[str, str]:
    """The target labels the Prometheus Operator's scrape configuration gives one operator
    pod behind the chart's metrics Service (its ServiceMonitor without a jobLabel)."""
    endpoint = service_monitor["spec"]["endpoints"][0]
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    return {
        "job": service["metadata"]["name"],
        "namespace": service["metadata"]["namespace"],
        "service": service["metadata"]["name"],
        "pod": pod_name,
        "container": "operator",
        "endpoint": endpoint["port"],
        "instance": f"{pod_ip}:{port['port']}",
    }


def stored_labels(exposed: Mapping[str, str], target: Mapping[str, str],
                  honor_labels: bool) -> dict[str, str]:
    """The labels Prometheus stores for one scraped sample (scrape_config honor_labels):

    honoring keeps the exposed value of a label the target also has; otherwise the
    exposed value moves to `exported_<label>` and the target's value takes its place.
    Target labels the sample does not carry are added either way.
    """
    stored = dict(exposed)
    for name, value in target.items():
        if name in exposed:
            if honor_labels:
                continue
            stored[f"exported_{name}"] = exposed[name]
        stored[name] = value
    return stored


def series_selector(labels: Mapping[str, str]) -> str:
    """`name{a="b",...}` as promtool's input_series wants it."""
    name = labels["__name__"]
    pairs = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()) if key != "__name__")
    return f"{name}{{{pairs}}}"


def selectors(expr: Any) -> list[Any]:
    """Every vector selector in a promql_parser expression tree."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        for child in ("expr", "lhs", "rhs", "vector_selector", "param"):
            if hasattr(node, child) and getattr(node, child) is not None:
                visit(getattr(node, child))
        for arg in getattr(node, "args", None) or []:
            visit(arg)

    visit(expr)
    return found


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, as the operator's own registry exports them (a
    histogram as its _bucket, _sum and _count series, `le` on the buckets), with the
    series it exports before any GuardedCronJob (process_*, guardedcron_build_info)."""
    metrics = create_metrics(CollectorRegistry())
    exported: dict[str, set[str]] = {
        sample.name: set(sample.labels)
        for family in metrics.registry.collect() for sample in family.samples}
    for metric in vars(metrics).values():
        labels = set(getattr(metric, "_labelnames", ()))
        if isinstance(metric, Counter):
            exported[f"{metric._name}_total"] = labels
        elif isinstance(metric, Gauge):
            exported[metric._name] = labels
        elif isinstance(metric, Histogram):
            exported[f"{metric._name}_bucket"] = labels | {"le"}
            exported[f"{metric._name}_sum"] = labels
            exported[f"{metric._name}_count"] = labels
    return exported


# The gauges the schedule-aware alerts read, as the operator exports them.
DEADLINE_GAUGES = (
    "guardedcron_last_success_timestamp_seconds",
    "guardedcron_next_slot_timestamp_seconds",
    "guardedcron_next_slot_start_deadline_timestamp_seconds",
    "guardedcron_success_overdue_timestamp_seconds",
)


def exported_gauges(gcj: Mapping[str, Any], previous_status: Mapping[str, Any] | None, now: datetime,
                    *, no_success_slots: int) -> dict[str, float]:
    """What one real pass over `gcj` (no CronJob, no Jobs; the runs' times in
    `previous_status`) makes the operator's /metrics show for it: DEADLINE_GAUGES by
    name, a gauge without a series left out."""
    change = compute_status(gcj=gcj, parsed=parse_guarded_cronjob(dict(gcj)), cronjob=None, jobs=[],
                            pods_by_job={}, previous_status=previous_status, now=now,
                            no_success_slots=no_success_slots)
    metrics = create_metrics(CollectorRegistry())
    labels = {"namespace": gcj["metadata"]["namespace"], "name": gcj["metadata"]["name"]}
    record_changes(metrics, **labels, changes=change.metrics)
    found = {name: metrics.registry.get_sample_value(name, labels) for name in DEADLINE_GAUGES}
    return {name: value for name, value in found.items() if value is not None}


# A series of one GuardedCronJob: its name, and its labels but namespace and name.
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def exported_job_gauges(gcj: Mapping[str, Any], previous_status: Mapping[str, Any] | None,
                        now: datetime, *, apply_error: str | None = None,
                        no_success_slots: int = 2) -> dict[SeriesKey, float]:
    """Every gauge sample one real pass over `gcj` (no CronJob, no Jobs; the runs and their
    counts in `previous_status`) makes the operator's /metrics show for it, by SeriesKey.
    An invalid spec is passed on as the handlers do: no parsed spec, its problems."""
    try:
        parsed, problems = parse_guarded_cronjob(dict(gcj)), ()
    except SpecError as error:
        parsed, problems = None, error.problems
    change = compute_status(gcj=gcj, parsed=parsed, spec_problems=problems, cronjob=None, jobs=[],
                            pods_by_job={}, previous_status=previous_status, now=now,
                            apply_error=apply_error, no_success_slots=no_success_slots)
    metrics = create_metrics(CollectorRegistry())
    job = {"namespace": gcj["metadata"]["namespace"], "name": gcj["metadata"]["name"]}
    record_changes(metrics, **job, changes=change.metrics)
    return {(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k not in job))):
            sample.value
            for family in metrics.registry.collect() if family.type == "gauge"
            for sample in family.samples if all(sample.labels.get(k) == v for k, v in job.items())}
