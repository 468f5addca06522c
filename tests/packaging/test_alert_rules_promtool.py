"""Every alert of the chart, evaluated by Prometheus' own rule engine (`promtool test rules`)
over series labelled the way Prometheus stores them when it scrapes the operator through
the chart's ServiceMonitor: each alert fires for the failing GuardedCronJob, names its
namespace (not the operator's), carries what a pager needs, and stays silent for a
healthy one, also across an operator restart (new pod, new series).

The schedule-aware alerts (SlotNotStarted, NoRecentSuccess) read deadlines the operator
computes on the real schedule, so their input series are what real passes of the real
code export for concrete GuardedCronJobs and clock values (`SCHEDULE_CASES`), each case
a promtool test group of its own whose clock starts at the case's first pass. The
alerts on a GuardedCronJob's state (Invalid, Stalled, NeverSucceeded) read gauges real
passes export from concrete objects and statuses likewise (`STATE_CASES`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import RELEASE_NAMESPACE, one, render
from tests.support.gcj import on_schedule, put
from tests.support.prometheus import (
    SeriesKey,
    exported_gauges,
    exported_job_gauges,
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
    job: tuple[str, str] | None  # None: a series of the operator's own, without namespace/name
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
    # The alert's labels besides severity, when not the failing job's namespace and name.
    labels: dict[str, str] | None = None


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
        alert="GuardedCronOperatorDown",
        series=(
            # Scraped every minute; the operator restarts at minute 100 (the new pod is
            # scraped from 103: a gap shorter than the lookback), then is gone from 150.
            Exposed("guardedcron_reconcile_duration_seconds_count", None, "0+1x100", POD_A),
            Exposed("guardedcron_reconcile_duration_seconds_count", None, "_x103 0+1x47", POD_B),
        ),
        # Absent from 156 (the lookback), firing 5 minutes later (`for: 5m`).
        fires_at={162: "", 200: ""},
        silent_at=(50, 102, 110, 158),
        labels={"job": "gc-guardedcron-metrics", "namespace": RELEASE_NAMESPACE},
    ),
)

# What the pager shows, written out for the failing job (namespace billing).
SUMMARIES = {
    "GuardedCronJobMissedRun": "GuardedCronJob billing/nightly-invoices missed a scheduled run",
    "GuardedCronJobOverlap": "Two runs of GuardedCronJob billing/nightly-invoices overlapped",
    "GuardedCronJobSlotNotStarted":
        "A scheduled run of GuardedCronJob billing/nightly-invoices has not started",
    "GuardedCronJobNoRecentSuccess":
        "GuardedCronJob billing/nightly-invoices has not succeeded in 2 slots in a row",
    "GuardedCronJobInvalid": "GuardedCronJob billing/nightly-invoices has an invalid spec",
    "GuardedCronJobStalled":
        "The CronJob of GuardedCronJob billing/nightly-invoices cannot be applied",
    "GuardedCronJobNeverSucceeded": "GuardedCronJob billing/nightly-invoices has never succeeded",
    "GuardedCronJobGuardErrors": "The guard of GuardedCronJob billing/nightly-invoices failed",
    "GuardedCronOperatorReconcileErrors":
        "The operator fails to reconcile GuardedCronJob billing/nightly-invoices",
    "GuardedCronOperatorDown":
        "The guardedcron operator in namespace guardedcron-system is down or not scraped",
}


def chart_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = one(render(values), "PrometheusRule")
    return list(rule["spec"]["groups"])


SLOT_NOT_STARTED = "GuardedCronJobSlotNotStarted"
NO_RECENT_SUCCESS = "GuardedCronJobNoRecentSuccess"
NO_SUCCESS_SLOTS = 2  # the chart's default metrics.prometheusRule.noSuccessSlots


@dataclass(frozen=True)
class Pass:
    """One reconcile pass of the real operator code: its clock, and the status times it
    finds (UTC, whole minutes; None: not there)."""

    at: str
    last_scheduled: str | None
    last_success: str | None


@dataclass(frozen=True)
class Check:
    at: str  # UTC
    alert: str
    fires: bool


@dataclass(frozen=True)
class ScheduleCase:
    """One GuardedCronJob (the failing job's name) on a real schedule: the gauges its
    passes export hold until the next pass, as the operator's do; no pass after the last."""

    title: str
    schedule: str
    zone: str | None
    created: str
    passes: tuple[Pass, ...]
    checks: tuple[Check, ...]
    spec: dict[str, Any] = field(default_factory=dict)


def silent(at: str, *alerts: str) -> tuple[Check, ...]:
    return tuple(Check(at, alert, False) for alert in alerts or (SLOT_NOT_STARTED, NO_RECENT_SUCCESS))


# startingDeadlineSeconds 600 + missedRunToleranceSeconds 60 (tests/support/gcj.py): a
# slot must have started 11 minutes after it is due. Berlin is UTC+2 in summer, UTC+1 in
# winter; 6 June 2025 is a Friday. Each false positive is what a period formula (N x the
# gap between the schedule's last two fire times) fired.
SCHEDULE_CASES = (
    ScheduleCase(
        title="weekdays: Friday's success, then nothing ran",
        schedule="0 9 * * 1-5", zone="Europe/Berlin", created="2025-06-01T00:00:00",
        passes=(Pass("2025-06-06T07:06:00", "2025-06-06T07:00:00", "2025-06-06T07:05:00"),),
        checks=(
            *silent("2025-06-07T12:00:00"),
            *silent("2025-06-08T07:06:00"),  # a period formula: 2 x 1 day after Friday's success
            *silent("2025-06-09T07:10:00"),
            Check("2025-06-09T07:12:00", SLOT_NOT_STARTED, True),  # Monday's slot, due by 07:11
            *silent("2025-06-10T12:00:00", NO_RECENT_SUCCESS),
            *silent("2025-06-11T07:10:00", NO_RECENT_SUCCESS),
            Check("2025-06-11T07:12:00", NO_RECENT_SUCCESS, True),  # Monday and Tuesday passed
        ),
    ),
    ScheduleCase(
        title="business hours: 17:55's success, then nothing ran",
        schedule="*/5 9-17 * * *", zone="Europe/Berlin", created="2025-06-01T00:00:00",
        passes=(Pass("2025-06-06T15:57:00", "2025-06-06T15:55:00", "2025-06-06T15:56:00"),),
        checks=(
            *silent("2025-06-06T16:10:00"),  # a period formula: 2 x 5 minutes
            *silent("2025-06-06T22:00:00"),
            *silent("2025-06-07T06:59:00"),
            Check("2025-06-07T07:12:00", SLOT_NOT_STARTED, True),  # 09:00's, due by 09:11
            *silent("2025-06-07T07:20:00", NO_RECENT_SUCCESS),
            Check("2025-06-07T07:22:00", NO_RECENT_SUCCESS, True),  # 09:00 and 09:05 passed
        ),
    ),
    ScheduleCase(
        title="daily in Berlin across the autumn change: 02:30 comes twice, both ran",
        schedule="30 2 * * *", zone="Europe/Berlin", created="2025-10-01T00:00:00",
        passes=(Pass("2025-10-26T00:41:00", "2025-10-26T00:30:00", "2025-10-26T00:40:00"),
                Pass("2025-10-26T01:41:00", "2025-10-26T01:30:00", "2025-10-26T01:40:00")),
        checks=(
            *silent("2025-10-26T01:35:00"),
            *silent("2025-10-26T03:45:00"),  # a period formula: 2 x the hour between the two
            *silent("2025-10-26T12:00:00"),
            *silent("2025-10-27T01:40:00"),
            Check("2025-10-27T01:42:00", SLOT_NOT_STARTED, True),
            *silent("2025-10-28T12:00:00", NO_RECENT_SUCCESS),
            Check("2025-10-29T01:42:00", NO_RECENT_SUCCESS, True),
        ),
    ),
    ScheduleCase(
        title="daily in Berlin across the spring change: no 02:30 on 30 March",
        schedule="30 2 * * *", zone="Europe/Berlin", created="2025-03-01T00:00:00",
        passes=(Pass("2025-03-29T01:41:00", "2025-03-29T01:30:00", "2025-03-29T01:40:00"),),
        checks=(
            *silent("2025-03-30T01:42:00"),  # a day after the last slot: none is due
            *silent("2025-03-30T12:00:00"),
            *silent("2025-03-31T00:40:00"),
            Check("2025-03-31T00:42:00", SLOT_NOT_STARTED, True),  # 02:30 CEST on 31 March
            *silent("2025-04-01T12:00:00", NO_RECENT_SUCCESS),
            Check("2025-04-02T00:42:00", NO_RECENT_SUCCESS, True),
        ),
    ),
    ScheduleCase(
        title="hashed: H H * * * is 02:47 for this lock",
        schedule="H H * * *", zone=None, created="2025-06-01T00:00:00",
        passes=(Pass("2025-06-02T02:50:00", "2025-06-02T02:47:00", "2025-06-02T02:49:00"),),
        checks=(
            *silent("2025-06-03T00:12:00"),
            *silent("2025-06-03T02:57:00"),
            Check("2025-06-03T02:59:00", SLOT_NOT_STARTED, True),
            *silent("2025-06-05T02:57:00", NO_RECENT_SUCCESS),
            Check("2025-06-05T02:59:00", NO_RECENT_SUCCESS, True),
        ),
    ),
    ScheduleCase(
        title="failing since its first run: counted from the creation",
        schedule="0 * * * *", zone=None, created="2025-06-02T10:20:00",
        passes=(Pass("2025-06-02T11:05:00", "2025-06-02T11:00:00", None),
                Pass("2025-06-02T12:05:00", "2025-06-02T12:00:00", None),
                Pass("2025-06-02T13:05:00", "2025-06-02T13:00:00", None)),
        checks=(
            *silent("2025-06-02T11:30:00"),
            *silent("2025-06-02T13:10:00"),
            Check("2025-06-02T13:12:00", NO_RECENT_SUCCESS, True),  # 11:00 and 12:00 passed
            *silent("2025-06-02T13:12:00", SLOT_NOT_STARTED),  # 13:00's started
        ),
    ),
    ScheduleCase(
        title="suspended: no deadlines at all",
        schedule="0 * * * *", zone=None, created="2025-05-01T00:00:00", spec={"suspend": True},
        passes=(Pass("2025-06-02T11:05:00", "2025-05-02T11:00:00", "2025-05-02T11:10:00"),),
        checks=silent("2025-06-02T12:00:00"),
    ),
)


INVALID = "GuardedCronJobInvalid"
STALLED = "GuardedCronJobStalled"
NEVER_SUCCEEDED = "GuardedCronJobNeverSucceeded"
STATE_ALERTS = (INVALID, STALLED, NEVER_SUCCEEDED)
# What those alerts read; the passes of a state case export the deadlines too, which
# the schedule cases test.
STATE_GAUGES = ("guardedcron_condition", "guardedcron_failed_runs_before_first_success")
STATE_CREATED = datetime(2025, 6, 2, 10, 20, tzinfo=UTC)
REFUSAL = 'admission webhook "policy.example" denied the request: jobs need a team label'


@dataclass(frozen=True)
class StatePass:
    """One real pass (no CronJob, no Jobs) at a minute of the case's clock, over the
    GuardedCronJob `spec` makes, the status it read, and the API server's refusal if any."""

    minute: int
    spec: dict[str, Any] = field(default_factory=dict)  # over on_schedule("0 * * * *", UTC)
    status: dict[str, Any] | None = None
    apply_error: str | None = None
    pod: tuple[str, str] = POD_A  # the operator pod that made the pass (and exports it)


@dataclass(frozen=True)
class StateCheck:
    minute: int
    alert: str
    fires: bool
    value: str = ""  # the $value the description shows


@dataclass(frozen=True)
class StateCase:
    title: str
    passes: tuple[StatePass, ...]
    checks: tuple[StateCheck, ...]


def quiet(minute: int, *alerts: str) -> tuple[StateCheck, ...]:
    return tuple(StateCheck(minute, alert, False) for alert in alerts or STATE_ALERTS)


NEVER_RAN: dict[str, Any] = {}
FAILED_ONCE = {"runCounts": {"failed": 1}, "lastScheduleTime": "2025-06-02T11:00:00Z"}
FAILED_TWICE = {"runCounts": {"failed": 1, "timedOut": 1}, "lastScheduleTime": "2025-06-02T12:00:00Z"}
SUCCEEDED_THIRD = {"runCounts": {"failed": 1, "timedOut": 1, "succeeded": 1},
                   "lastScheduleTime": "2025-06-02T13:00:00Z", "lastSuccessfulTime": "2025-06-02T13:04:00Z"}

STATE_CASES = (
    StateCase(
        title="a misspelt time zone: Invalid until it is fixed",
        passes=(StatePass(0, {"timeZone": "Europe/Berln"}), StatePass(20, {"timeZone": "Europe/Berlin"})),
        checks=(*quiet(4, INVALID), StateCheck(6, INVALID, True), *quiet(6, STALLED, NEVER_SUCCEEDED),
                StateCheck(19, INVALID, True), *quiet(21)),
    ),
    StateCase(
        title="the API server refuses the CronJob: Stalled until it is accepted",
        passes=(StatePass(0, apply_error=REFUSAL), StatePass(30)),
        checks=(*quiet(4, STALLED), StateCheck(6, STALLED, True), *quiet(6, INVALID, NEVER_SUCCEEDED),
                *quiet(31)),
    ),
    StateCase(
        title="a new valid GuardedCronJob that has not run yet: nothing fires",
        passes=(StatePass(0, status=NEVER_RAN), StatePass(30, status=NEVER_RAN)),
        checks=(*quiet(10), *quiet(59)),
    ),
    StateCase(
        title="failing since its first run, across an operator restart, until a success",
        passes=(StatePass(0, status=NEVER_RAN), StatePass(45, status=FAILED_ONCE),
                StatePass(105, status=FAILED_TWICE), StatePass(130, status=FAILED_TWICE, pod=POD_B),
                StatePass(165, status=SUCCEEDED_THIRD, pod=POD_B)),
        checks=(*quiet(44), StateCheck(46, NEVER_SUCCEEDED, True, "1"),
                StateCheck(106, NEVER_SUCCEEDED, True, "2"), StateCheck(131, NEVER_SUCCEEDED, True, "2"),
                StateCheck(164, NEVER_SUCCEEDED, True, "2"), *quiet(166), *quiet(200)),
    ),
    StateCase(
        title="failures after a success, and a suspended job that never succeeded: silent",
        passes=(StatePass(0, status={"runCounts": {"succeeded": 1, "failed": 5},
                                     "lastSuccessfulTime": "2025-06-01T10:04:00Z"}),
                StatePass(30, {"suspend": True}, status={"runCounts": {"failed": 3}})),
        checks=(*quiet(10), *quiet(40)),
    ),
)


def state_gcj(one_pass: StatePass) -> dict[str, Any]:
    body = put(on_schedule("0 * * * *", None), "metadata.creationTimestamp",
               STATE_CREATED.strftime("%Y-%m-%dT%H:%M:%SZ"))
    for path, value in one_pass.spec.items():
        body = put(body, f"spec.{path}", value)
    return body


def state_exports(case: StateCase) -> list[tuple[StatePass, dict[SeriesKey, float]]]:
    rows = []
    for one_pass in case.passes:
        exported = exported_job_gauges(state_gcj(one_pass), one_pass.status,
                                       STATE_CREATED + timedelta(minutes=one_pass.minute),
                                       apply_error=one_pass.apply_error)
        rows.append((one_pass, {key: v for key, v in exported.items() if key[0] in STATE_GAUGES}))
    return rows


def state_series(case: StateCase, values: dict[str, Any]) -> list[dict[str, str]]:
    """input_series of one case: per operator pod, each gauge its latest pass exported,
    held until the next pass; a series the pod stops exporting (removed, or the pod gone
    after a restart) gets Prometheus' staleness marker."""
    horizon = max(check.minute for check in case.checks)
    exports = state_exports(case)
    namespace, name = FAILING
    rows = []
    for pod in dict.fromkeys(one_pass.pod for one_pass in case.passes):
        target, honor = scrape_labels(values, pod)
        for key in sorted({key for one_pass, exported in exports if one_pass.pod == pod for key in exported}):
            tokens: list[str] = []
            for minute in range(horizon + 1):
                latest, exported = [row for row in exports if row[0].minute <= minute][-1]
                value = exported.get(key) if latest.pod == pod else None
                if value is not None:
                    tokens.append(f"{value:.0f}")
                else:
                    tokens.append("stale" if tokens and tokens[-1] not in ("stale", "_") else "_")
            metric, extra = key
            labels = {"__name__": metric, "namespace": namespace, "name": name, **dict(extra)}
            rows.append({"series": series_selector(stored_labels(labels, target, honor)),
                         "values": " ".join(tokens)})
    return rows


def state_group(case: StateCase, values: dict[str, Any], by_alert: dict[str, Any]) -> dict[str, Any]:
    checks = [{"eval_time": f"{check.minute}m", "alertname": check.alert,
               "exp_alerts": [expected_alert(by_alert[check.alert], check.value)] if check.fires else []}
              for check in case.checks]
    return {"interval": "1m", "input_series": state_series(case, values), "alert_rule_test": checks}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def minutes_between(start: datetime, end: datetime) -> int:
    seconds = (end - start).total_seconds()
    assert seconds % 60 == 0, (start, end)
    return int(seconds // 60)


def case_gcj(case: ScheduleCase) -> dict[str, Any]:
    body = on_schedule(case.schedule, case.zone, **case.spec)
    return put(body, "metadata.creationTimestamp", case.created + "Z")


def case_exports(case: ScheduleCase) -> list[tuple[int, dict[str, float]]]:
    """(minute of the case's clock, what the real pass then exported), per pass."""
    origin = utc(case.passes[0].at)
    rows = []
    for one_pass in case.passes:
        status = {key: value + "Z" for key, value in (("lastScheduleTime", one_pass.last_scheduled),
                                                      ("lastSuccessfulTime", one_pass.last_success))
                  if value is not None}
        exported = exported_gauges(case_gcj(case), status, utc(one_pass.at),
                                   no_success_slots=NO_SUCCESS_SLOTS)
        rows.append((minutes_between(origin, utc(one_pass.at)), exported))
    return rows


def expanding(values: list[float | None]) -> str:
    """promtool's expanding notation for one sample a minute (`_`: no sample)."""
    runs: list[str] = []
    index = 0
    while index < len(values):
        length = 1
        while index + length < len(values) and values[index + length] == values[index]:
            length += 1
        value = values[index]
        if value is None:
            runs.append(f"_x{length}")
        else:
            runs.append(f"{value:.0f}+0x{length - 1}")
        index += length
    return " ".join(runs)


def case_series(case: ScheduleCase, target: dict[str, str], honor: bool) -> list[dict[str, str]]:
    """input_series of one case: every gauge its passes exported, held from one pass to the
    next and after the last, as values relative to the case's clock (promtool's starts at 0,
    the case's at its first pass: `time() - deadline` is unchanged)."""
    origin = utc(case.passes[0].at)
    horizon = max(minutes_between(origin, utc(check.at)) for check in case.checks)
    exports = case_exports(case)
    namespace, name = FAILING
    rows = []
    for metric in sorted({metric for _, exported in exports for metric in exported}):
        values: list[float | None] = []
        for minute in range(horizon + 1):
            held = [exported for at, exported in exports if at <= minute][-1]
            value = held.get(metric)
            values.append(None if value is None else value - origin.timestamp())
        labels = {"__name__": metric, "namespace": namespace, "name": name}
        rows.append({"series": series_selector(stored_labels(labels, target, honor)),
                     "values": expanding(values)})
    return rows


def case_deadline(case: ScheduleCase, check: Check) -> float:
    """The deadline the alert compares with at the check's time (the latest pass's)."""
    gauge = {SLOT_NOT_STARTED: "guardedcron_next_slot_start_deadline_timestamp_seconds",
             NO_RECENT_SUCCESS: "guardedcron_success_overdue_timestamp_seconds"}[check.alert]
    origin = utc(case.passes[0].at)
    minute = minutes_between(origin, utc(check.at))
    return [exported for at, exported in case_exports(case) if at <= minute][-1][gauge]


def humanize_duration(seconds: float) -> str:
    """Prometheus' humanizeDuration for a minute or more (the cases fire a whole minute late)."""
    assert seconds >= 60, seconds
    whole = int(seconds)
    days, hours, minutes, rest = whole // 86400, whole // 3600 % 24, whole // 60 % 60, whole % 60
    if days:
        return f"{days}d {hours}h {minutes}m {rest}s"
    if hours:
        return f"{hours}h {minutes}m {rest}s"
    return f"{minutes}m {rest}s"


def stored_series(values: dict[str, Any]) -> list[dict[str, str]]:
    """input_series for promtool: every scenario's series, labelled as Prometheus stores
    them under the ServiceMonitor the chart renders with `values`."""
    rows: list[dict[str, str]] = []
    for scenario in SCENARIOS:
        for exposed in scenario.series:
            job = {"namespace": exposed.job[0], "name": exposed.job[1]} if exposed.job else {}
            labels = {"__name__": exposed.metric, **job, **exposed.labels}
            target, honor = scrape_labels(values, exposed.pod)
            rows.append({"series": series_selector(stored_labels(labels, target, honor)),
                         "values": exposed.values})
    return rows


def scrape_labels(values: dict[str, Any], pod: tuple[str, str]) -> tuple[dict[str, str], bool]:
    """The target labels of one operator pod and honor_labels, under the rendered ServiceMonitor."""
    objects = render(values)
    monitor = one(objects, "ServiceMonitor")
    honor = bool(monitor["spec"]["endpoints"][0].get("honorLabels", False))
    return operator_target_labels(monitor, one(objects, "Service"), *pod), honor


def expected_alert(rule: dict[str, Any], value_text: str,
                   labels: dict[str, str] | None = None) -> dict[str, Any]:
    namespace, name = FAILING
    description = (
        rule["annotations"]["description"]
        .replace("{{ $labels.namespace }}", namespace)
        .replace("{{ $labels.name }}", name)
        .replace("{{ $value | humanizeDuration }}", value_text)
        .replace("{{ $value }}", value_text)
    )
    assert "{{" not in description, description
    return {
        "exp_labels": {**(labels or {"namespace": namespace, "name": name}),
                       "severity": rule["labels"]["severity"]},
        "exp_annotations": {"summary": SUMMARIES[rule["alert"]], "description": description,
                            "runbook_url": rule["annotations"]["runbook_url"]},
    }


def case_group(case: ScheduleCase, values: dict[str, Any], by_alert: dict[str, Any]) -> dict[str, Any]:
    """One promtool test group: the case's series and checks on the case's own clock."""
    target, honor = scrape_labels(values, POD_A)
    origin = utc(case.passes[0].at)
    checks = []
    for check in case.checks:
        minute = minutes_between(origin, utc(check.at))
        late = utc(check.at).timestamp() - case_deadline(case, check) if check.fires else 0.0
        checks.append({"eval_time": f"{minute}m", "alertname": check.alert,
                       "exp_alerts": [expected_alert(by_alert[check.alert], humanize_duration(late))]
                       if check.fires else []})
    return {"interval": "1m", "input_series": case_series(case, target, honor),
            "alert_rule_test": checks}


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
                           "exp_alerts": [expected_alert(rule, value_text, scenario.labels)]})
        for minute in scenario.silent_at:
            checks.append({"eval_time": f"{minute}m", "alertname": scenario.alert, "exp_alerts": []})
    test_file = directory / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": stored_series(values), "alert_rule_test": checks},
                  *(case_group(case, values, by_alert) for case in SCHEDULE_CASES),
                  *(state_group(case, values, by_alert) for case in STATE_CASES)],
    }, sort_keys=False))
    return test_file


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    alerts = {rule["alert"] for group in chart_rules(MONITORING) for rule in group["rules"]}
    assert {scenario.alert for scenario in SCENARIOS} | {SLOT_NOT_STARTED, NO_RECENT_SUCCESS,
                                                         *STATE_ALERTS} == alerts
    assert set(SUMMARIES) == alerts
    for scenario in SCENARIOS:
        assert scenario.fires_at and scenario.silent_at, scenario.alert
    for alert in (SLOT_NOT_STARTED, NO_RECENT_SUCCESS):
        checks = [check for case in SCHEDULE_CASES for check in case.checks if check.alert == alert]
        assert any(c.fires for c in checks) and not all(c.fires for c in checks), alert
    for alert in STATE_ALERTS:
        state_checks = [check for case in STATE_CASES for check in case.checks if check.alert == alert]
        assert any(c.fires for c in state_checks) and not all(c.fires for c in state_checks), alert


def test_the_chart_default_is_the_slot_count_the_cases_expect() -> None:
    rendered = render(MONITORING)
    env = {e["name"]: e.get("value") for e in one(rendered, "Deployment")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["GUARDEDCRON_NO_SUCCESS_SLOTS"] == str(NO_SUCCESS_SLOTS)


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda case: case.title)
def test_each_case_exports_what_its_checks_assume(case: ScheduleCase) -> None:
    """The real passes give every firing check a deadline a minute or more behind it, and
    the suspended case no deadline at all."""
    exports = case_exports(case)
    if case.spec.get("suspend"):
        assert all("guardedcron_success_overdue_timestamp_seconds" not in e for _, e in exports)
        return
    for check in case.checks:
        if check.fires:
            assert utc(check.at).timestamp() - case_deadline(case, check) >= 60, (case.title, check)


def test_promtool_check_rules_accepts_the_chart_rules(tmp_path: Path, promtool_binary: Path) -> None:
    rules = write_rule_file(tmp_path / "rules.yaml", chart_rules(MONITORING))
    result = promtool(promtool_binary, ["check", "rules", str(rules)], tmp_path)
    assert result.code == 0, result.output
    assert "SUCCESS: 10 rules found" in result.output, result.output


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
