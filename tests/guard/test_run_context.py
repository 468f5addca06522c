"""The guard's run context (issue 14): the slot `repeatedTime: Once` claims, across two
clusters on one real PostgreSQL, and what lease.json tells the workload."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from guardedcron.schedule.dst import slot_of
from tests.support import run_cli

LOCK = "finance/ledger-close"
ZONE = ["--time-zone", "Europe/Stockholm"]
# 02:30 in Stockholm twice on 25 October 2026: 00:30Z (summer time) and 01:30Z (winter time).
FIRST = slot_of(datetime(2026, 10, 25, 0, 30, tzinfo=UTC))
SECOND = slot_of(datetime(2026, 10, 25, 1, 30, tzinfo=UTC))


def acquire(dsn: str, holder: str, job_name: str, *extra: str, out: Path | None = None) -> Any:
    args = ["acquire", "--lock", LOCK, "--holder", holder, "--lease-seconds", "60",
            "--job-name", job_name, "--cronjob", "ledger-close", *extra]
    return run_cli([*args, "--out", str(out)] if out else args, dsn=dsn)


def release(dsn: str, holder: str, fence: int) -> None:
    assert run_cli(["release", "--lock", LOCK, "--holder", holder, "--fence", str(fence)],
                   dsn=dsn).code == 0


def test_once_runs_the_repeated_wall_time_once_across_clusters(dsn: str) -> None:
    first = acquire(dsn, "eu-north/finance/pod-a", f"ledger-close-{FIRST}", *ZONE,
                    "--repeated-time", "Once")
    assert first.code == 0, first.stderr
    assert first.json["slot"] == FIRST
    release(dsn, "eu-north/finance/pod-a", first.json["fence"])
    # An hour later the clock shows 02:30 again; the other cluster's CronJob fires.
    second = acquire(dsn, "eu-west/finance/pod-b", f"ledger-close-{SECOND}", *ZONE,
                     "--repeated-time", "Once")
    assert second.code == 75, second.stderr
    assert (second.json["reason"], second.json["slot"]) == ("slot-claimed", FIRST)
    assert "already ran under eu-north/finance/pod-a" in second.stderr


def test_twice_is_still_the_default(dsn: str) -> None:
    first = acquire(dsn, "a", f"ledger-close-{FIRST}", *ZONE)
    assert first.code == 0, first.stderr
    release(dsn, "a", first.json["fence"])
    second = acquire(dsn, "b", f"ledger-close-{SECOND}", *ZONE)
    assert (second.code, second.json["slot"]) == (0, SECOND), second.stderr


def test_once_when_the_first_showing_did_not_run_the_second_does(dsn: str) -> None:
    second = acquire(dsn, "b", f"ledger-close-{SECOND}", *ZONE, "--repeated-time", "Once")
    assert (second.code, second.json["slot"]) == (0, FIRST), second.stderr


def test_lease_json_carries_the_run_context(dsn: str, tmp_path: Path) -> None:
    result = acquire(dsn, "a", f"ledger-close-{SECOND}", *ZONE, out=tmp_path / "run")
    assert result.code == 0, result.stderr
    lease = json.loads((tmp_path / "run" / "lease.json").read_text())
    assert {k: lease[k] for k in ("lock", "fence", "slot", "run_id")} == {
        "lock": LOCK, "fence": result.json["fence"], "slot": SECOND,
        "run_id": result.json["run_id"]}
    assert isinstance(lease["run_id"], int)
    assert {k: lease[k] for k in ("run_kind", "manual", "scheduled_time", "scheduled_time_utc",
                                  "time_zone")} == {
        "run_kind": "scheduled", "manual": False,
        "scheduled_time": "2026-10-25T02:30:00+01:00",
        "scheduled_time_utc": "2026-10-25T01:30:00Z", "time_zone": "Europe/Stockholm"}


def test_lease_json_of_a_backfill_and_of_a_manual_run(dsn: str, tmp_path: Path) -> None:
    backfill = acquire(dsn, "a", f"ledger-close-{FIRST}", "--run-kind", "backfill",
                       out=tmp_path / "backfill")
    assert backfill.code == 0, backfill.stderr
    lease = json.loads((tmp_path / "backfill" / "lease.json").read_text())
    assert (lease["run_kind"], lease["manual"], lease["scheduled_time_utc"],
            lease["scheduled_time"], lease["time_zone"]) == (
        "backfill", False, "2026-10-25T00:30:00Z", None, None)
    release(dsn, "a", backfill.json["fence"])
    manual = acquire(dsn, "b", "ledger-close-manual-x7k2", *ZONE, out=tmp_path / "manual")
    assert manual.code == 0, manual.stderr
    lease = json.loads((tmp_path / "manual" / "lease.json").read_text())
    assert (lease["run_kind"], lease["manual"], lease["slot"], lease["scheduled_time"]) == (
        "manual", True, None, None)


def test_bad_run_context_input_exits_64_and_touches_nothing(dsn: str, tmp_path: Path) -> None:
    for extra, words in (
        ([*ZONE[:1], "Mars/Olympus_Mons"], "--time-zone 'Mars/Olympus_Mons' is not an IANA"),
        (["--repeated-time", "Once"], "--repeated-time Once needs --time-zone"),
        ([*ZONE, "--run-kind", "whenever"], "invalid choice: 'whenever'"),
    ):
        result = acquire(dsn, "a", f"ledger-close-{FIRST}", *extra, out=tmp_path / "run")
        assert result.code == 64, (extra, result.stderr)
        assert words in result.stderr
        assert not (tmp_path / "run").exists()
    # Nothing was claimed: a good request now takes fence 1 for the slot.
    good = acquire(dsn, "a", f"ledger-close-{FIRST}")
    assert (good.code, good.json["fence"]) == (0, 1), good.stderr
