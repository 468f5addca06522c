"""Which skipped runs' Jobs are removed: final scheduled skips that status records, that
Job instance only; a manual run's skip, a skip still settling, a Job already being
deleted and every other outcome stay."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from guardedcron.status.runs import Outcome, RunRecord
from guardedcron.status.skips import SkippedJob, skipped_jobs_to_remove

AT = datetime(2025, 5, 3, 0, 30, tzinfo=UTC)


def live(name: str, uid: str = "u1", *, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": uid}
    if deleting:
        metadata["deletionTimestamp"] = "2025-05-03T00:31:00Z"
    return {"metadata": metadata}


def record(name: str, outcome: Outcome = Outcome.SKIPPED, *, manual: bool = False,
           final: bool = True) -> RunRecord:
    return RunRecord(job=name, outcome=outcome, reason="r", holder="eu-2/billing/x", fence=4,
                     manual=manual, started_at=AT, finished_at=AT if final else None)


def test_a_final_scheduled_skip_is_removed_by_its_uid() -> None:
    remembered = {"j-2": record("j-2"), "j-1": record("j-1")}
    assert skipped_jobs_to_remove(remembered, [live("j-2", "u2"), live("j-1", "u1")]) == (
        SkippedJob("j-1", "u1"), SkippedJob("j-2", "u2"))


@pytest.mark.parametrize("run, job", [
    (record("j", manual=True), live("j")),  # its person reads why it did not run
    (record("j", final=False), live("j")),
    (record("j"), live("j", deleting=True)),
    (record("j", Outcome.FAILED), live("j")),
    (record("j", Outcome.SUCCEEDED), live("j")),
    (record("other"), live("j")),  # status does not record this Job
], ids=["manual", "not-final", "being-deleted", "failed", "succeeded", "unrecorded"])
def test_what_stays(run: RunRecord, job: dict[str, Any]) -> None:
    assert skipped_jobs_to_remove({run.job: run}, [job]) == ()
