"""What must hold after a chaos run, asked of the database alone.

Definitions (they decide what counts as a violation):

- **Duplicate**: an item with more than one committed effect of one kind (charge, send,
  delete), or any committed effect the dedupe key absorbed (someone else had already
  done it: two runs believed they owned the item at once). The effects log has no
  unique key, so a second committed attempt is a second row, never a hidden error.
- **Overlap of current fences**: two committed fenced transactions of one lock whose
  order contradicts their fences, i.e. a write with fence f committed after a write
  with a fence greater than f. Each fenced transaction draws a sequence number after
  its fence check; a takeover must wait for it to commit, so honest order is
  non-decreasing fences. A stalled holder that was taken over is not an overlap when
  its late writes were refused (then they never committed); it is one if any landed.
  The run history must agree: `history.find_overlaps` finds no run that started while an
  earlier fenced run had not finished (a taken-over run ends when its lease ran out),
  and every fenced write was made by the holder that fence was granted to.
- **Stale refusal**: a refused write is justified only when a run of the same lock with
  a greater fence had started before the refusal.
- **History**: every attempt the guard answered (won or lost) has its own run row, with
  the same holder, fence and outcome; no run is left `running`; the fences of a lock
  only grow in the order they were granted, each granted once, and the lease row holds
  the greatest; no slot ran twice; nobody unknown wrote a row.
- **Nothing outstanding**: after the final clean runs, the queue is empty and every
  enqueued item was charged, sent and deleted exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from guardedcron.guard.history import find_overlaps

Connection = psycopg.Connection[tuple[Any, ...]]
NOT_FINAL_FOR_WINNERS = ("running", "skipped")


@dataclass
class Findings:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, what: str, rows: list[tuple[Any, ...]], limit: int = 5) -> None:
        if rows:
            shown = "; ".join(str(r) for r in rows[:limit])
            self.violations.append(f"{what}: {len(rows)} (e.g. {shown})")


def scalar(conn: Connection, sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    return None if row is None else row[0]


def check_all(conn: Connection) -> Findings:
    found = Findings()
    check_duplicates(conn, found)
    check_fence_order(conn, found)
    check_refusals(conn, found)
    check_history(conn, found)
    check_outstanding(conn, found)
    return found


def check_duplicates(conn: Connection, found: Findings) -> None:
    doubled = conn.execute(
        "SELECT item, kind, count(*) FROM chaos.effects GROUP BY item, kind HAVING count(*) > 1 ORDER BY item"
    ).fetchall()
    absorbed = conn.execute(
        "SELECT item, kind, holder, fence FROM chaos.effects WHERE absorbed ORDER BY item"
    ).fetchall()
    found.check("items with a step committed more than once", doubled)
    found.check("effects absorbed by a dedupe key (a second owner got that far)", absorbed)
    found.figures["duplicates"] = len(doubled)  # an absorbed effect always has a first one: counted there
    # The same, lane by lane (a lock's name starts with its lane's: proc, conn, net, pool, burst).
    by_lane = conn.execute(
        """
        SELECT l.lane, count(DISTINCT l.item),
               (SELECT count(*) FROM (SELECT 1 FROM chaos.effects e
                                       WHERE split_part(e.lock_name, '-', 1) = l.lane
                                       GROUP BY e.item, e.kind HAVING count(*) > 1) d)
          FROM (SELECT split_part(lock_name, '-', 1) AS lane, item FROM chaos.ledger) l
         GROUP BY l.lane ORDER BY l.lane
        """
    ).fetchall()
    found.figures["items_and_duplicates_by_lane"] = {str(lane): [int(i), int(d)] for lane, i, d in by_lane}


def check_fence_order(conn: Connection, found: Findings) -> None:
    out_of_order = conn.execute(
        """
        SELECT lock_name, write_seq, fence, holder, max_before FROM (
            SELECT w.*, max(fence) OVER (PARTITION BY lock_name ORDER BY write_seq
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS max_before
              FROM chaos.fenced_writes w) ordered
         WHERE max_before > fence
         ORDER BY write_seq
        """
    ).fetchall()
    found.check("fenced writes committed after a newer fence had written (overlap)", out_of_order)
    foreign = conn.execute(
        """
        SELECT w.lock_name, w.fence, w.holder, r.holder
          FROM chaos.fenced_writes w
          LEFT JOIN guardedcron.runs r ON r.lock_name = w.lock_name AND r.fence = w.fence
         WHERE r.holder IS DISTINCT FROM w.holder
        """
    ).fetchall()
    found.check("fenced writes by a holder the fence was not granted to", foreign)
    overlaps = []
    for (lock,) in conn.execute("SELECT DISTINCT lock_name FROM guardedcron.runs ORDER BY 1").fetchall():
        overlaps += [
            (lock, o.earlier.fence, o.earlier.holder, o.later.fence, o.later.holder)
            for o in find_overlaps(conn, lock)
        ]
    found.check("history overlaps (a run started while an earlier fenced run was unfinished)", overlaps)
    found.figures["fenced_transactions"] = scalar(conn, "SELECT count(*) FROM chaos.fenced_writes")
    found.figures["fences_granted"] = scalar(
        conn, "SELECT count(*) FROM guardedcron.runs WHERE fence IS NOT NULL"
    )


def check_refusals(conn: Connection, found: Findings) -> None:
    unjustified = conn.execute(
        """
        SELECT f.lock_name, f.fence, f.holder, f.refused_at FROM chaos.refusals f
         WHERE NOT EXISTS (SELECT 1 FROM guardedcron.runs r
                            WHERE r.lock_name = f.lock_name AND r.fence > f.fence
                              AND r.started_at <= f.refused_at)
            OR NOT EXISTS (SELECT 1 FROM guardedcron.runs r
                            WHERE r.lock_name = f.lock_name AND r.fence = f.fence AND r.holder = f.holder)
        """
    ).fetchall()
    found.check("refused writes whose fence was still current (or never granted)", unjustified)
    found.figures["stale_writes_refused"] = scalar(conn, "SELECT count(*) FROM chaos.refusals")


def check_history(conn: Connection, found: Findings) -> None:
    missing = conn.execute(
        """
        SELECT a.holder, a.reason, a.run_id, r.holder, r.outcome, r.fence, a.fence
          FROM chaos.attempts a
          LEFT JOIN guardedcron.runs r ON r.id = a.run_id
         WHERE a.answered
           AND (r.id IS NULL OR r.holder <> a.holder
                OR (a.acquired AND (r.fence IS DISTINCT FROM a.fence OR r.outcome = ANY(%s)))
                OR (NOT a.acquired AND r.outcome <> 'skipped'))
         ORDER BY a.holder
        """,
        (list(NOT_FINAL_FOR_WINNERS),),
    ).fetchall()
    found.check("answered attempts without their own final history row", missing)
    running = conn.execute(
        "SELECT id, lock_name, holder, fence FROM guardedcron.runs WHERE outcome = 'running' ORDER BY id"
    ).fetchall()
    found.check("runs still marked running after the final clean runs", running)
    strangers = conn.execute(
        "SELECT r.id, r.holder FROM guardedcron.runs r"
        " WHERE NOT EXISTS (SELECT 1 FROM chaos.attempts a WHERE a.holder = r.holder) ORDER BY r.id"
    ).fetchall()
    found.check("history rows of holders the harness never started", strangers)
    repeated = conn.execute(
        "SELECT holder, count(*) FROM guardedcron.runs GROUP BY holder HAVING count(*) > 1 ORDER BY 1"
    ).fetchall()
    found.check("attempts with more than one history row", repeated)
    # Fences come from one sequence for all locks (schema 3), so a lock's are not
    # consecutive; in the order its runs were granted they must only grow.
    fences = conn.execute(
        """
        SELECT lock_name, count(*), count(DISTINCT fence), max(fence),
               (SELECT fence FROM guardedcron.leases l WHERE l.lock_name = r.lock_name),
               count(*) FILTER (WHERE fence <= previous)
          FROM (SELECT lock_name, fence, lag(fence) OVER (PARTITION BY lock_name ORDER BY id) AS previous
                  FROM guardedcron.runs WHERE fence IS NOT NULL) r
         GROUP BY lock_name
        """
    ).fetchall()
    found.check(
        "locks whose fences did not only grow, each granted once, up to the lease's",
        [f for f in fences if not (f[1] == f[2] and f[3] == f[4] and f[5] == 0)],
    )
    slots_twice = conn.execute(
        "SELECT lock_name, slot, count(*) FROM guardedcron.runs"
        " WHERE slot IS NOT NULL AND outcome <> 'skipped' GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    found.check("slots that ran more than once", slots_twice)
    outcomes = conn.execute("SELECT outcome, count(*) FROM guardedcron.runs GROUP BY 1 ORDER BY 1").fetchall()
    found.figures["runs_by_outcome"] = {str(o): int(n) for o, n in outcomes}
    found.figures["acquired_but_never_told"] = scalar(
        conn,
        "SELECT count(*) FROM chaos.attempts a JOIN guardedcron.runs r ON r.holder = a.holder"
        " WHERE NOT a.answered AND r.fence IS NOT NULL",
    )


def check_outstanding(conn: Connection, found: Findings) -> None:
    left = conn.execute("SELECT item, lock_name, state FROM chaos.queue ORDER BY item").fetchall()
    found.check("items still outstanding after the final clean runs", left)
    not_once = conn.execute(
        """
        SELECT l.item, l.lock_name,
               count(*) FILTER (WHERE e.kind = 'charge'), count(*) FILTER (WHERE e.kind = 'send'),
               count(*) FILTER (WHERE e.kind = 'delete')
          FROM chaos.ledger l LEFT JOIN chaos.effects e ON e.item = l.item
         GROUP BY l.item, l.lock_name
        HAVING count(*) FILTER (WHERE e.kind = 'charge') <> 1
            OR count(*) FILTER (WHERE e.kind = 'send') <> 1
            OR count(*) FILTER (WHERE e.kind = 'delete') <> 1
         ORDER BY l.item
        """
    ).fetchall()
    found.check("items not charged, sent and deleted exactly once", not_once)
    business = conn.execute(
        "SELECT (SELECT count(*) FROM chaos.ledger), (SELECT count(*) FROM chaos.invoices),"
        " (SELECT count(*) FROM chaos.outbox)"
    ).fetchone()
    assert business is not None
    if not business[0] == business[1] == business[2]:
        found.violations.append(f"items/invoices/outbox rows differ: {business}")
    found.figures["items"] = int(business[0])
