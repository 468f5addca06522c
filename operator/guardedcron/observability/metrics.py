"""Prometheus metrics of the operator, and the endpoint that serves them.

Names and labels are a contract with the chart's PrometheusRule (docs/design.md,
"Metrics"). What changes is decided in status/ (`MetricChanges`, part of the
`StatusChange` compute_status returns): counters move only on transitions between two
statuses (the same ones that make Events), so an idle resync or an operator restart
counts nothing twice; gauges are set from the status itself, so they are right again
after a restart. This module only counts. Metrics live in their own registry, not the
process-global one, so tests and several operators in one process do not mix; each
registry also carries the process's own (`process_*`) and the build's version.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.aiohttp import make_aiohttp_handler

from guardedcron import __version__, contract
from guardedcron.status import EXPORTED_CONDITIONS, MetricChanges, Outcome

# The `outcome` label of runs_total and run_duration_seconds.
OUTCOME_LABELS: Final[Mapping[Outcome, str]] = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.FAILED: "failed",
    Outcome.SKIPPED: "skipped",
    Outcome.TIMED_OUT: "timed_out",
    Outcome.LOST: "lease_lost",
    Outcome.GUARD_ERROR: "guard_error",
}
# From a skip (well under a second) to the longest deadlines people give nightly jobs.
RUN_DURATION_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                               7200.0, 21600.0, 86400.0)
RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METRICS_PATH: Final = "/metrics"


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    runs: Counter
    missed_runs: Counter
    overlaps: Counter
    last_success: Gauge
    next_slot: Gauge
    next_slot_start_deadline: Gauge
    success_overdue: Gauge
    run_duration: Histogram
    reconcile_duration: Histogram
    reconcile_errors: Counter
    suspended_after_failures: Gauge
    make_up_runs: Counter
    condition: Gauge
    failed_before_first_success: Gauge
    build_info: Gauge


def create_metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """Every guardedcron metric, registered in `registry` (a new one if not given)."""
    registry = registry if registry is not None else CollectorRegistry()
    per_job = ("namespace", "name")
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, _resident_memory_bytes, ...
    build_info = Gauge("guardedcron_build_info", "Always 1; the operator's version as a label.",
                       ("version",), registry=registry)
    build_info.labels(__version__).set(1)
    return Metrics(
        registry=registry,
        runs=Counter("guardedcron_runs_total", "Finished runs by outcome.",
                     (*per_job, "outcome"), registry=registry),
        missed_runs=Counter("guardedcron_missed_runs_total",
                            "Schedule slots whose start deadline passed with no run (MissedRun).",
                            per_job, registry=registry),
        overlaps=Counter("guardedcron_overlaps_total",
                         "Runs seen holding the lock while another run of it was active.",
                         per_job, registry=registry),
        last_success=Gauge("guardedcron_last_success_timestamp_seconds",
                           "End time of the last successful run, in Unix seconds.",
                           per_job, registry=registry),
        next_slot=Gauge("guardedcron_next_slot_timestamp_seconds",
                        "When the earliest slot not started yet is due, in Unix seconds.",
                        per_job, registry=registry),
        next_slot_start_deadline=Gauge(
            "guardedcron_next_slot_start_deadline_timestamp_seconds",
            "When that slot must have started (due + startingDeadlineSeconds + "
            "missedRunToleranceSeconds), in Unix seconds.", per_job, registry=registry),
        success_overdue=Gauge(
            "guardedcron_success_overdue_timestamp_seconds",
            "When the operator's no-success count of slots in a row will have passed without "
            "a success, in Unix seconds.", per_job, registry=registry),
        run_duration=Histogram("guardedcron_run_duration_seconds",
                               "Run durations, from the lease won (or the Job started) to the end.",
                               (*per_job, "outcome"), buckets=RUN_DURATION_BUCKETS, registry=registry),
        reconcile_duration=Histogram("guardedcron_reconcile_duration_seconds",
                                     "One reconcile pass of one GuardedCronJob.",
                                     buckets=RECONCILE_BUCKETS, registry=registry),
        reconcile_errors=Counter("guardedcron_reconcile_errors_total",
                                 "Reconcile passes that ended in an error.",
                                 per_job, registry=registry),
        suspended_after_failures=Gauge(
            "guardedcron_suspended_after_failures",
            "1 while the operator keeps the CronJob suspended after spec.suspendAfterFailures "
            "failed runs in a row, else 0 (only with that field set).", per_job, registry=registry),
        make_up_runs=Counter("guardedcron_make_up_runs_total",
                             "Jobs the operator started for past slots, by kind "
                             "(catch-up, backfill, skipped-time).",
                             (*per_job, "kind"), registry=registry),
        condition=Gauge("guardedcron_condition",
                        "1 while the condition `type` (Invalid, Stalled) is True, else 0.",
                        (*per_job, "type"), registry=registry),
        failed_before_first_success=Gauge(
            "guardedcron_failed_runs_before_first_success",
            "Runs that ended without success while none has succeeded (0 before the first "
            "ends); no series once one has, or while spec.suspend is set.",
            per_job, registry=registry),
        build_info=build_info,
    )


def record_changes(metrics: Metrics, *, namespace: str, name: str, changes: MetricChanges) -> None:
    """Count what one pass changed, and set the gauges; call it once per pass."""
    for run in changes.finished:
        outcome = OUTCOME_LABELS[run.outcome]
        metrics.runs.labels(namespace, name, outcome).inc()
        if run.seconds is not None:
            metrics.run_duration.labels(namespace, name, outcome).observe(run.seconds)
    if changes.missed_runs:
        metrics.missed_runs.labels(namespace, name).inc(changes.missed_runs)
    if changes.overlaps:
        metrics.overlaps.labels(namespace, name).inc(changes.overlaps)
    if changes.last_success is not None:
        _set(metrics.last_success, changes.last_success.timestamp(), namespace, name)
    for kind, true in changes.conditions:
        _set(metrics.condition, 1.0 if true else 0.0, namespace, name, kind)
    if changes.failed_before_first_success is not None:
        _set(metrics.failed_before_first_success, changes.failed_before_first_success, namespace, name)
    else:
        _remove(metrics.failed_before_first_success, namespace, name)
    deadlines = changes.deadlines
    for gauge, instant in (
        (metrics.next_slot, deadlines.next_slot if deadlines else None),
        (metrics.next_slot_start_deadline, deadlines.next_slot_start_deadline if deadlines else None),
        (metrics.success_overdue, deadlines.success_overdue if deadlines else None),
    ):
        if instant is not None:
            _set(gauge, instant.timestamp(), namespace, name)
        else:  # no run expected (suspended, invalid spec) or no such slot: no series
            _remove(gauge, namespace, name)


def _set(gauge: Gauge, value: float, *labels: str) -> None:
    gauge.labels(*labels).set(value)


def record_suspension(metrics: Metrics, *, namespace: str, name: str, suspended: bool | None) -> None:
    """Set the suspended-after-failures gauge from the pass's decision; None (the field is
    unset) removes the series."""
    if suspended is None:
        _remove(metrics.suspended_after_failures, namespace, name)
    else:
        _set(metrics.suspended_after_failures, 1 if suspended else 0, namespace, name)


def observe_reconcile(metrics: Metrics, *, namespace: str, name: str, seconds: float, error: bool) -> None:
    metrics.reconcile_duration.observe(seconds)
    if error:
        metrics.reconcile_errors.labels(namespace, name).inc()


@contextlib.contextmanager
def reconcile_timer(metrics: Metrics, *, namespace: str, name: str) -> Iterator[None]:
    """Times the block as one reconcile pass; an exception counts as an error (and is re-raised)."""
    started = time.monotonic()
    failed = True
    try:
        yield
        failed = False
    finally:
        observe_reconcile(metrics, namespace=namespace, name=name,
                          seconds=time.monotonic() - started, error=failed)


def forget(metrics: Metrics, *, namespace: str, name: str) -> None:
    """Drop every series of a deleted GuardedCronJob, so it stops being exported."""
    for metric in (metrics.missed_runs, metrics.overlaps, metrics.last_success, metrics.next_slot,
                   metrics.next_slot_start_deadline, metrics.success_overdue,
                   metrics.reconcile_errors, metrics.suspended_after_failures,
                   metrics.failed_before_first_success):
        _remove(metric, namespace, name)
    for kind in EXPORTED_CONDITIONS:
        _remove(metrics.condition, namespace, name, kind)
    for kind in (contract.RUN_KIND_CATCH_UP, contract.RUN_KIND_BACKFILL, contract.RUN_KIND_SKIPPED_TIME):
        _remove(metrics.make_up_runs, namespace, name, kind)
    for outcome in OUTCOME_LABELS.values():
        _remove(metrics.runs, namespace, name, outcome)
        _remove(metrics.run_duration, namespace, name, outcome)


def _remove(metric: Counter | Gauge | Histogram, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set for this GuardedCronJob
        metric.remove(*labels)


class MetricsServer:
    """The /metrics endpoint, served on the operator's asyncio loop (aiohttp)."""

    def __init__(self, runner: web.AppRunner, site: web.TCPSite, port: int) -> None:
        self._runner = runner
        self._site = site
        self.port = port

    async def stop(self) -> None:
        await self._runner.cleanup()


async def start_metrics_server(
    port: int, registry: CollectorRegistry, *, host: str = "0.0.0.0",
) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics; port 0 binds a free port (see `.port`).

    The operator's setting `GUARDEDCRON_METRICS_PORT=0` means "off": check it before calling.
    """
    app = web.Application()
    app.router.add_get(METRICS_PATH, make_aiohttp_handler(registry))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return MetricsServer(runner, site, _bound_port(runner, port))


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested
