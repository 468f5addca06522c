"""Run history queries: list, overlaps, gaps against a schedule, abandoned runs.

Overlaps and gaps are the two questions the run table exists to answer: did two
runs of one lock work at the same time, and did an expected run never happen?
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

WORKING_OUTCOMES = ("running", "succeeded", "failed", "finished", "abandoned", "lost")


@dataclass(frozen=True)
class Run:
    id: int
    lock: str
    slot: int | None
    holder: str
    fence: int | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["started_at"] = self.started_at.isoformat()
        data["finished_at"] = self.finished_at.isoformat() if self.finished_at else None
        return data


@dataclass(frozen=True)
class Overlap:
    """`later` started while `earlier` (which held a fence too) had not finished."""

    earlier: Run
    later: Run


@dataclass(frozen=True)
class Gap:
    expected_at: datetime
    slot: int


_RUN_COLUMNS = "id, lock_name, slot, holder, fence, started_at, finished_at, outcome, reason"


def _run(row: tuple[Any, ...]) -> Run:
    return Run(*row)


def check_grant(conn: Connection, lock: str) -> None:
    """Raise LockNotGranted unless the connection's role may read `lock`'s history.

    Row-level security already hides other locks' runs from a runtime role; this says so
    instead of answering with an empty history."""
    import psycopg

    from guardedcron.guard.errors import not_granted

    try:
        conn.execute("SELECT guardedcron.check_grant_v1(%s)", (lock,))
    except psycopg.Error as exc:
        refusal = not_granted(exc, lock, conn.info.user)
        if refusal is not None:
            raise refusal from None
        raise


def list_runs(conn: Connection, lock: str, limit: int = 50) -> list[Run]:
    from guardedcron.guard.timestamps import reading

    rows = reading(conn).execute(
        f"SELECT {_RUN_COLUMNS} FROM guardedcron.runs WHERE lock_name = %s"
        " ORDER BY started_at DESC, id DESC LIMIT %s",
        (lock, limit),
    ).fetchall()
    return [_run(r) for r in rows]


def mark_abandoned(conn: Connection, lock: str) -> int:
    row = conn.execute("SELECT guardedcron.mark_abandoned_v1(%s)", (lock,)).fetchone()
    return int(row[0]) if row else 0


def find_overlaps(conn: Connection, lock: str) -> list[Overlap]:
    """Runs that started before an earlier fenced run of the same lock had finished.

    One pass in start order, carrying the latest end seen so far, so it stays linear on a
    year of per-minute history. A running run has no end yet: 'infinity' stands for it,
    which compares like "now" with any run that has started, and being a constant it lets
    the pass read the (lock_name, started_at, id) index in order instead of materialising
    and sorting the history (clock_timestamp() in the CTE did that: 1.4 s on 535,000 runs).
    """
    from guardedcron.guard.timestamps import reading

    rows = reading(conn).execute(
        f"""
        SELECT {_RUN_COLUMNS} FROM (
            SELECT {_RUN_COLUMNS},
                   max(coalesce(finished_at, 'infinity'::timestamptz)) OVER (
                       ORDER BY started_at, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
                   ) AS prev_max_end
              FROM guardedcron.runs
             WHERE lock_name = %s AND fence IS NOT NULL
        ) ordered
         WHERE prev_max_end > started_at
         ORDER BY started_at, id
        """,
        (lock,),
    ).fetchall()
    overlaps: list[Overlap] = []
    for row in rows:
        later = _run(row)
        earlier_row = reading(conn).execute(
            f"SELECT {_RUN_COLUMNS} FROM guardedcron.runs"
            " WHERE lock_name = %s AND fence IS NOT NULL AND id <> %s AND started_at <= %s"
            " AND coalesce(finished_at, clock_timestamp()) > %s"
            " ORDER BY started_at DESC, id DESC LIMIT 1",
            (lock, later.id, later.started_at, later.started_at),
        ).fetchone()
        if earlier_row is not None:
            overlaps.append(Overlap(_run(earlier_row), later))
    return overlaps


def find_gaps(conn: Connection, lock: str, expected: list[datetime]) -> list[Gap]:
    """Expected fire times that no run of theirs started for, anywhere.

    A slot (minutes since the epoch, as the CronJob controller names Jobs) is covered by a
    run that won the lease for it, whatever its outcome. Skipped attempts cover nothing by
    themselves (the run that claimed the slot does), and neither does a manual run, which
    has no slot: a scheduled run it turned away is a gap. The operator's MissedRun counts
    the same way (`RunRecord.settles_slot`; docs/design.md, "Run-or-report").
    """
    if not expected:
        return []
    from guardedcron.guard.timestamps import reading

    rows = reading(conn).execute(
        "SELECT DISTINCT slot FROM guardedcron.runs"
        " WHERE lock_name = %s AND outcome <> 'skipped' AND slot BETWEEN %s AND %s",
        (lock, slot_of(expected[0]), slot_of(expected[-1])),
    ).fetchall()
    covered_slots = {int(r[0]) for r in rows}
    return [Gap(when, slot_of(when)) for when in expected if slot_of(when) not in covered_slots]


def slot_of(when: datetime) -> int:
    """Minutes since the epoch: the suffix the CronJob controller gives a scheduled Job."""
    return int(when.timestamp()) // 60
