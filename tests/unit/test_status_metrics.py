"""Metrics, scraped from the real /metrics endpoint after real status passes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from guardedcron import contract
from guardedcron.cli.main import installed_version
from guardedcron.observability import (
    Metrics,
    create_metrics,
    forget,
    reconcile_timer,
    record_changes,
    start_metrics_server,
)
from guardedcron.status import EventReason
from tests.support import status_objects as k
from tests.support.status_world import Run, Runs, compute_change, slot, the_gcj

GCJ = the_gcj(created=slot(10) - timedelta(minutes=1))
LABELS = {"namespace": "billing", "name": k.CRONJOB}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(tmp_path, monkeypatch)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Metrics, str]]:
    metrics = create_metrics()
    server = await start_metrics_server(0, metrics.registry, host="127.0.0.1")
    try:
        yield metrics, f"http://127.0.0.1:{server.port}/metrics"
    finally:
        await server.stop()


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


class Operator:
    """What the handlers do after each pass: record the change, keep the status."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.status: dict[str, Any] | None = None
        self.now = slot(10)

    def step(self, world: list[Run], minutes: float = 1) -> list[EventReason]:
        self.now += timedelta(minutes=minutes)
        with reconcile_timer(self.metrics, **LABELS):
            change = compute_change(world, self.status, self.now, gcj=GCJ)
        record_changes(self.metrics, **LABELS, changes=change.metrics)
        self.status = k.json_roundtrip(change.status)  # as stored and read back
        return [e.reason for e in change.events]


async def test_metrics_follow_transitions_and_ignore_resyncs(served: tuple[Metrics, str], runs: Runs) -> None:
    metrics, url = served
    op = Operator(metrics)
    op.step([runs.running(slot(10), 1)])
    op.step([runs.succeeded(slot(10), 1, minutes=10)], minutes=15)
    for _ in range(3):  # idle resyncs
        assert op.step([runs.succeeded(slot(10), 1, minutes=10)]) == []
    op.step([runs.succeeded(slot(10), 1, minutes=10), runs.skipped(slot(11), 7)], minutes=24 * 60)
    op.step([runs.succeeded(slot(10), 1, minutes=10), runs.skipped(slot(11), 7), runs.guard_error(slot(12))],
            minutes=24 * 60)
    # 13 May: no Job at all, so a missed run once its deadline passed
    assert EventReason.MISSED_RUN in op.step([], minutes=24 * 60 + 20)
    op.step([], minutes=5)

    samples = await scrape(url)
    runs_total = "guardedcron_runs_total"
    assert value(samples, runs_total, **LABELS, outcome="succeeded") == 1
    assert value(samples, runs_total, **LABELS, outcome="skipped") == 1
    assert value(samples, runs_total, **LABELS, outcome="guard_error") == 1
    assert value(samples, runs_total, **LABELS, outcome="failed") is None
    # Two missed slots: 12 May's, whose only run ended GuardError (its work never ran), and
    # 13 May's, which had no Job at all.
    assert value(samples, "guardedcron_missed_runs_total", **LABELS) == 2
    assert value(samples, "guardedcron_overlaps_total", **LABELS) is None
    success_end = slot(10) + timedelta(minutes=10)
    assert value(samples, "guardedcron_last_success_timestamp_seconds", **LABELS) == success_end.timestamp()
    # 13 May's slot (00:30Z) never started: the next slot stays it, past its start deadline
    # (11 minutes on); 11 and 12 May passed without a success (each had until the next
    # slot's start deadline), so the success is overdue at 13 May's start deadline.
    assert value(samples, "guardedcron_next_slot_timestamp_seconds", **LABELS) == slot(13).timestamp()
    deadline = (slot(13) + timedelta(minutes=11)).timestamp()
    assert value(samples, "guardedcron_next_slot_start_deadline_timestamp_seconds", **LABELS) == deadline
    assert value(samples, "guardedcron_success_overdue_timestamp_seconds", **LABELS) == deadline
    # The successful run lasted from the lease won (guard exit, 4 s in) to the Job's end.
    duration = "guardedcron_run_duration_seconds"
    assert value(samples, f"{duration}_count", **LABELS, outcome="succeeded") == 1
    assert value(samples, f"{duration}_sum", **LABELS, outcome="succeeded") == 600 - 4
    assert value(samples, f"{duration}_bucket", **LABELS, outcome="succeeded", le="600.0") == 1
    assert value(samples, f"{duration}_bucket", **LABELS, outcome="succeeded", le="300.0") == 0
    assert value(samples, "guardedcron_reconcile_duration_seconds_count") == 9
    assert value(samples, "guardedcron_reconcile_errors_total", **LABELS) is None


async def test_overlap_and_reconcile_errors(served: tuple[Metrics, str], runs: Runs) -> None:
    metrics, url = served
    op = Operator(metrics)
    both = [runs.running(slot(10), 4), runs.running(slot(10) + timedelta(minutes=1), 5, manual=True)]
    op.step(both)
    op.step(both)
    with pytest.raises(RuntimeError), reconcile_timer(metrics, **LABELS):
        raise RuntimeError("API server went away")
    samples = await scrape(url)
    assert value(samples, "guardedcron_overlaps_total", **LABELS) == 1
    assert value(samples, "guardedcron_reconcile_errors_total", **LABELS) == 1
    assert value(samples, "guardedcron_reconcile_duration_seconds_count") == 3


DEADLINES = ("guardedcron_next_slot_timestamp_seconds",
             "guardedcron_next_slot_start_deadline_timestamp_seconds",
             "guardedcron_success_overdue_timestamp_seconds")


async def test_a_suspended_guardedcronjob_has_no_deadlines(served: tuple[Metrics, str], runs: Runs) -> None:
    metrics, url = served
    op = Operator(metrics)
    op.step([runs.succeeded(slot(10), 1)], minutes=15)
    running = await scrape(url)
    assert all(value(running, name, **LABELS) is not None for name in DEADLINES)
    change = compute_change([runs.succeeded(slot(10), 1)], op.status, op.now + timedelta(minutes=1),
                            gcj=the_gcj(created=slot(10) - timedelta(minutes=1), suspend=True))
    record_changes(metrics, **LABELS, changes=change.metrics)
    samples = await scrape(url)
    assert all(value(samples, name, **LABELS) is None for name in DEADLINES)
    assert value(samples, "guardedcron_last_success_timestamp_seconds", **LABELS) is not None


async def test_a_deleted_guardedcronjob_stops_being_exported(served: tuple[Metrics, str], runs: Runs) -> None:
    metrics, url = served
    op = Operator(metrics)
    op.step([runs.succeeded(slot(10), 1)], minutes=15)
    assert value(await scrape(url), "guardedcron_runs_total", **LABELS, outcome="succeeded") == 1
    for kind in (contract.RUN_KIND_CATCH_UP, contract.RUN_KIND_BACKFILL, contract.RUN_KIND_SKIPPED_TIME):
        metrics.make_up_runs.labels(LABELS["namespace"], LABELS["name"], kind).inc()
    # A success removed it; as a job that never succeeded has it:
    metrics.failed_before_first_success.labels(LABELS["namespace"], LABELS["name"]).set(2)
    assert value(await scrape(url), "guardedcron_condition", **LABELS, type="Invalid") == 0
    forget(metrics, **LABELS)
    forget(metrics, **LABELS)  # twice is fine
    samples = await scrape(url)
    assert not [key for key in samples if ("name", k.CRONJOB) in key[1]]


async def test_registries_are_separate() -> None:
    first, second = create_metrics(), create_metrics()
    first.missed_runs.labels("a", "b").inc()
    labels = {"namespace": "a", "name": "b"}
    assert first.registry.get_sample_value("guardedcron_missed_runs_total", labels) == 1
    assert second.registry.get_sample_value("guardedcron_missed_runs_total", labels) is None


async def test_the_endpoint_serves_the_process_and_the_build_version(served: tuple[Metrics, str]) -> None:
    """Before any GuardedCronJob: the process's own series (prometheus_client's
    ProcessCollector, on the operator's registry) and the version, as pip installed it."""
    _, url = served
    samples = await scrape(url)
    assert value(samples, "guardedcron_build_info", version=installed_version()) == 1
    assert [key for key in samples if key[0] == "guardedcron_build_info"] == [
        ("guardedcron_build_info", (("version", installed_version()),))]
    assert (value(samples, "process_resident_memory_bytes") or 0) > 10 * 2**20
    assert value(samples, "process_cpu_seconds_total") is not None
    assert (value(samples, "process_open_fds") or 0) >= 3
    started = value(samples, "process_start_time_seconds")
    assert started is not None and started > slot(10).timestamp()


NEVER = "guardedcron_failed_runs_before_first_success"


async def test_runs_that_failed_before_the_first_success(served: tuple[Metrics, str], runs: Runs) -> None:
    """0 until the first run ends; each run that ends without success counts (a skip does
    not); the series goes with the first success, and stays gone after later failures."""
    metrics, url = served
    op = Operator(metrics)
    op.step([])
    assert value(await scrape(url), NEVER, **LABELS) == 0
    op.step([runs.running(slot(10), 1)])
    assert value(await scrape(url), NEVER, **LABELS) == 0
    world = [runs.failed(slot(10), 1)]
    op.step(world, minutes=15)
    assert value(await scrape(url), NEVER, **LABELS) == 1
    world += [runs.skipped(slot(11), 7), runs.timed_out(slot(12), 8), runs.guard_error(slot(13))]
    op.step(world, minutes=4 * 24 * 60)
    assert value(await scrape(url), NEVER, **LABELS) == 3
    # An operator restart: a new registry, the status as stored.
    restarted = Operator(create_metrics())
    restarted.status, restarted.now = op.status, op.now
    restarted.step(world)
    assert restarted.metrics.registry.get_sample_value(NEVER, LABELS) == 3
    world += [runs.succeeded(slot(14), 9)]
    op.step(world, minutes=24 * 60)
    assert value(await scrape(url), NEVER, **LABELS) is None
    op.step([*world, runs.failed(slot(15), 10)], minutes=24 * 60)
    assert value(await scrape(url), NEVER, **LABELS) is None


async def test_suspended_a_job_that_never_succeeded_has_no_count(
        served: tuple[Metrics, str], runs: Runs) -> None:
    metrics, url = served
    op = Operator(metrics)
    op.step([runs.failed(slot(10), 1)], minutes=15)
    assert value(await scrape(url), NEVER, **LABELS) == 1
    change = compute_change([runs.failed(slot(10), 1)], op.status, op.now + timedelta(minutes=1),
                            gcj=the_gcj(created=slot(10) - timedelta(minutes=1), suspend=True))
    record_changes(metrics, **LABELS, changes=change.metrics)
    assert value(await scrape(url), NEVER, **LABELS) is None


async def test_invalid_and_stalled_follow_the_conditions(served: tuple[Metrics, str]) -> None:
    """guardedcron_condition is 1 while the status's condition is True: a misspelt time
    zone (Invalid), a CronJob the API server refuses (Stalled); 0 for a valid object."""
    metrics, url = served
    now = slot(10)

    def conditions(gcj: dict[str, Any], apply_error: str | None = None) -> dict[str, float | None]:
        change = compute_change([], None, now, gcj=gcj, apply_error=apply_error)
        record_changes(metrics, **LABELS, changes=change.metrics)
        return {kind: metrics.registry.get_sample_value("guardedcron_condition", {**LABELS, "type": kind})
                for kind in ("Invalid", "Stalled")}

    assert conditions(the_gcj(timeZone="Europe/Berln")) == {"Invalid": 1, "Stalled": 0}
    assert conditions(the_gcj(), apply_error="admission webhook denied the request") == {
        "Invalid": 0, "Stalled": 1}
    assert conditions(the_gcj()) == {"Invalid": 0, "Stalled": 0}
    assert conditions(the_gcj(timeZone="Europe/Berln")) == {"Invalid": 1, "Stalled": 0}
    samples = await scrape(url)
    assert value(samples, "guardedcron_condition", **LABELS, type="Invalid") == 1
    # An invalid spec has no schedule: no deadline series.
    assert all(value(samples, name, **LABELS) is None for name in DEADLINES)
