"""Run-or-report: every slot runs exactly once or is reported missed, never silent, never both.

Two clusters, one database, the operators and the CronJob controllers all real; each
scenario a GuardedCronJob of its own, every minute, with the CRD's defaults except the
time knobs (startingDeadlineSeconds 20 + missedRunToleranceSeconds 10: a slot is
settled or missed 30 s after it is due, so a report comes within the minute). The
faults, on one timeline (A..E are five consecutive minutes):

- operator down: both operators SIGKILLed 15 s before B, started again 45 s after it;
- controller-manager down: both kube-controller-managers stopped 15 s before D and
  started 45 s after it, past its 20 s starting deadline, so nothing fires D late;
- database down: this scenario's own PostgreSQL server stopped (immediate: a crash)
  10 s before B, started 40 s after it;
- guard pod killed mid-run: B's running pod deleted in the cluster that won B;
- a run longer than its period in the other cluster: A's run held until 35 s after B;
- a manual run across a slot: started 25 s before B in east, held until 35 s after B;
- a run that finishes early, the next slot right after it.

Then, per scenario and slot of its window, from the database (winning runs, one per
slot) and each cluster's Events, metrics and status: ran once, reported missed by
every cluster, silent (neither: must be 0), false alarm (ran and reported: must be 0).
The table is printed (docs/e2e.md, "Run-or-report") and asserted.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import pytest

from guardedcron import contract
from guardedcron.guard.migrations import migrate
from guardedcron.spec.locks import namespace_lock
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.e2e.harness import (
    DSN_KEY,
    DSN_SECRET,
    EAST,
    WEST,
    Cluster,
    Scenario,
    WorkDb,
    guarded_cronjob,
    job_finished,
    workload_container,
)
from tests.e2e.operator_process import OperatorProcess
from tests.e2e.workload import SCHEMA
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TIMES = {"startingDeadlineSeconds": 20, "missedRunToleranceSeconds": 10}
GRACE_SECONDS = 30  # the two above: a slot is missed once this has passed without its run
PERIOD_SECONDS = 60  # every minute
RENEWAL_SECONDS = 20  # the keeper's renewal interval with the default 60 s lease
SETUP_MARGIN_SECONDS = 25  # A is the first whole minute at least this far after set-up


@dataclass
class Row:
    """One scenario: its GuardedCronJob in both clusters, the slots it is judged on (as
    offsets from A), and the database its guards use."""

    title: str
    name: str
    window: tuple[int, ...]
    db: WorkDb | None = None
    gate: bool = False
    held: tuple[str, ...] = ()  # job names whose gate the timeline opens; the rest open at once
    namespace: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def lock(self) -> str:
        return namespace_lock(self.namespace, self.name)


def sleep_until(instant: float) -> None:
    time.sleep(max(0.0, instant - time.time()))


def slot_job(name: str, slot: int) -> str:
    return f"{name}-{slot}"


def winning_runs(db: WorkDb, lock: str) -> dict[int, int]:
    """Winners (the guard won the lease) per slot, from the guard's history."""
    rows = db.query("SELECT slot, count(*) FROM guardedcron.runs WHERE lock_name = %s AND fence IS"
                    " NOT NULL AND outcome <> 'skipped' AND slot IS NOT NULL GROUP BY slot", (lock,))
    return {int(slot): int(count) for slot, count in rows}


def gcj_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    gcj = cluster.get(f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/"
                      f"{contract.PLURAL}/{name}") or {}
    status: dict[str, Any] = gcj.get("status") or {}
    return status


def missed_events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The MissedRun Events the operator posted on one GuardedCronJob."""
    return [e for e in cluster.api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e.get("reason") == "MissedRun" and e["involvedObject"].get("name") == name]


def missed_reports(cluster: Cluster, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    """The MissedRun Events of one GuardedCronJob, by the slot each names."""
    pattern = re.compile(rf"\(Job {re.escape(name)}-(\d+)")
    found: dict[int, dict[str, Any]] = {}
    for event in missed_events(cluster, namespace, name):
        match = pattern.search(event.get("message") or "")
        if match:
            found[int(match.group(1))] = event
    return found


def reported_after_deadline(event: dict[str, Any], slot: int) -> float:
    """Seconds from the slot's start deadline to the Event."""
    posted = datetime.fromisoformat(event.get("eventTime") or event["firstTimestamp"])
    return posted.timestamp() - (slot * 60 + GRACE_SECONDS)


def missed_counter(operator: OperatorProcess, namespace: str, name: str) -> float:
    for line in operator.metrics().splitlines():
        if line.startswith("guardedcron_missed_runs_total{") and f'namespace="{namespace}"' in line \
                and f'name="{name}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def own_db() -> Iterator[tuple[ThrowawayPostgres, WorkDb]]:
    """A PostgreSQL server of the database-down scenario's own, migrated."""
    with ThrowawayPostgres() as server:
        dsn = server.create_database("liveness")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute(SCHEMA)
        yield server, WorkDb(dsn)


def test_every_slot_runs_once_or_is_reported_missed(
    operator_scenario: Scenario, clusters: dict[str, Cluster],
    operators: dict[str, OperatorProcess], own_db: tuple[ThrowawayPostgres, WorkDb],
) -> None:
    east, west = clusters[EAST], clusters[WEST]
    both = [east, west]
    server, down_db = own_db
    shared = operator_scenario.db
    rows = {
        "operator": Row("operator down across a slot", "live-op", (0, 1, 2)),
        "controllers": Row("controller-manager down across a slot", "live-kcm", (2, 3, 4)),
        "database": Row("database down across a slot", "live-db", (0, 1, 2), db=down_db),
        "killed": Row("guard pod killed mid-run", "live-kill", (0, 1, 2), gate=True),
        "long": Row("a run longer than its period in the other cluster", "live-long", (0, 1, 2), gate=True),
        "manual": Row("a manual run across a slot", "live-manual", (0, 1, 2), gate=True),
        "early": Row("a run that finishes early, the next slot right after", "live-early", (0, 1, 2)),
    }
    for row in rows.values():
        row.namespace = operator_scenario.namespace(row.name, both)
        if row.db is not None:  # its Secret names its own server
            for cluster in both:
                cluster.kubectl("delete", "secret", DSN_SECRET, "-n", row.namespace)
                cluster.kubectl("create", "secret", "generic", DSN_SECRET, "-n", row.namespace,
                                f"--from-literal={DSN_KEY}={row.db.dsn}")
        manifest = guarded_cronjob(row.name, row.namespace, spec=TIMES,
                                   container=workload_container(items=2, gate=row.gate))
        for cluster in both:
            cluster.apply(manifest)
    for row in rows.values():
        for cluster in both:
            wait_for(f"the CronJob of {row.name} in {cluster.name}", lambda c=cluster, r=row: c.get(
                f"/apis/batch/v1/namespaces/{r.namespace}/cronjobs/{r.name}"), timeout=60)
    a = (int(time.time() + SETUP_MARGIN_SECONDS) // 60 + 1)  # slot A, minutes since the epoch
    at = {offset: (a + offset) * 60.0 for offset in range(6)}  # A..E and the minute after
    b = a + 1
    manual_job = "live-manual-across"
    rows["long"].held = (slot_job("live-long", a),)
    rows["killed"].held = (slot_job("live-kill", b),)
    rows["manual"].held = (manual_job,)
    for row in rows.values():
        if row.gate:
            for offset in range(-1, 6):
                job = slot_job(row.name, a + offset)
                if job not in row.held:
                    shared.open_gate(job)
    print(f"slot A is {a}; scenarios: {', '.join(f'{r.name} in {r.namespace}' for r in rows.values())}")


    def kill_operators() -> None:
        for operator in operators.values():
            operator.kill()

    def start_operators() -> None:
        for operator in operators.values():
            if not operator.running():
                operator.start()

    def start_manual_run() -> None:
        east.create_job_from(rows["manual"].namespace, "live-manual", manual_job)
        wait_for("the manual run holds the lease", lambda: shared.query(
            "SELECT 1 FROM e2e_work WHERE job = %s", (manual_job,)), timeout=30)

    def kill_the_running_pod() -> None:
        row, job = rows["killed"], slot_job("live-kill", b)
        [(holder,)] = wait_for(f"{job} runs", lambda: shared.query(
            "SELECT holder FROM e2e_work WHERE job = %s LIMIT 1", (job,)), timeout=40)
        [winner] = [c for c in both if str(holder).startswith(f"{c.name}/")]
        pod = winner.pod_of(row.namespace, job)["metadata"]["name"]
        killed_at = time.monotonic()
        winner.kubectl("delete", "pod", pod, "-n", row.namespace, "--wait=false")
        wait_for("the killed run's lease is released", lambda: shared.query(
            "SELECT 1 FROM guardedcron.leases WHERE lock_name = %s AND released_at IS NOT NULL",
            (row.lock,)), timeout=RENEWAL_SECONDS)
        row.result["released after"] = time.monotonic() - killed_at

    def open_held_gates() -> None:
        for row in rows.values():
            for job in row.held:
                shared.open_gate(job)

    stopped: set[str] = set()  # what the timeline took down and has not brought back yet

    def take_down(what: str, action: Callable[[], None]) -> Callable[[], None]:
        def step() -> None:
            stopped.add(what)
            action()
        return step

    def bring_back(what: str, action: Callable[[], None]) -> Callable[[], None]:
        def step() -> None:
            action()
            stopped.discard(what)
        return step

    def stop_controllers() -> None:
        for cluster in both:
            cluster.plane.stop_part("kube-controller-manager")

    def start_controllers() -> None:
        for cluster in both:
            cluster.plane.start_part("kube-controller-manager")

    steps: list[tuple[float, str, Callable[[], None]]] = []
    back = {"operators": start_operators, "database": server.start, "controllers": start_controllers}
    steps += [
        (at[1] - 25, "a manual run in east", start_manual_run),
        (at[1] - 15, "both operators killed", take_down("operators", kill_operators)),
        (at[1] - 10, "the database crashes", take_down("database", lambda: server.stop("immediate"))),
        (at[1] + 5, "the running pod killed", kill_the_running_pod),
        (at[1] + 35, "the held runs go on", open_held_gates),
        (at[1] + 40, "the database back", bring_back("database", server.start)),
        (at[1] + 45, "both operators back", bring_back("operators", start_operators)),
        (at[3] - 15, "both controller-managers stopped", take_down("controllers", stop_controllers)),
        (at[3] + 45, "both controller-managers back", bring_back("controllers", start_controllers)),
    ]
    try:
        for instant, what, action in steps:
            sleep_until(instant)
            print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)
            action()
    finally:  # whatever failed, the clusters and operators are left whole for the next test
        open_held_gates()
        for what in sorted(stopped):
            back[what]()

    # E's runs end and D's reports come with E's passes; then every slot is judged.
    def verdicts_of(row: Row) -> dict[int, str]:
        won = winning_runs(row.db or shared, row.lock)
        reports = {c.name: missed_reports(c, row.namespace, row.name) for c in both}
        verdicts: dict[int, str] = {}
        for offset in row.window:
            slot = a + offset
            reported = [name for name, found in reports.items() if slot in found]
            runs = won.get(slot, 0)
            if runs > 1:
                verdicts[slot] = "ran twice"
            elif runs == 1:
                verdicts[slot] = "false alarm" if reported else "ran once"
            elif len(reported) == len(both):
                verdicts[slot] = "reported missed"
            else:
                verdicts[slot] = "silent"
        return verdicts

    deadline = at[5] + GRACE_SECONDS + 30
    for row in rows.values():
        with contextlib.suppress(AssertionError):  # a slot still silent then is the table's to show
            wait_for(f"every slot of {row.name} settled or reported",
                     lambda r=row: "silent" not in verdicts_of(r).values(),
                     timeout=max(1.0, deadline - time.time()), interval=2)
        row.result["verdicts"] = verdicts_of(row)
        delays = [reported_after_deadline(event, slot) for c in both
                  for slot, event in missed_reports(c, row.namespace, row.name).items()
                  if row.result["verdicts"].get(slot) == "reported missed"]
        row.result["delays"] = delays
        row.result["latest report"] = f"{max(delays):.0f}" if delays else "-"

    table = ["| scenario | slots | ran once | reported missed | silent | false alarms "
             "| latest report, s after the deadline |", "|---|---|---|---|---|---|---|"]
    for row in rows.values():
        verdicts = list(row.result["verdicts"].values())
        table.append(f"| {row.title} | {len(verdicts)} | {verdicts.count('ran once')} | "
                     f"{verdicts.count('reported missed')} | {verdicts.count('silent')} | "
                     f"{verdicts.count('false alarm') + verdicts.count('ran twice')} | "
                     f"{row.result['latest report']} |")
    print("\n".join(table))
    released = rows["killed"].result["released after"]
    print(f"the killed run's lease was free {released:.1f} s after the deletion")
    for row in rows.values():
        assert set(row.result["verdicts"].values()) <= {"ran once", "reported missed"}, (
            row.title, row.result["verdicts"])

    # Reported by the first pass after the deadline: at the latest the next slot's (its Job
    # wakes the operator), or the operator's start when it was down at the deadline.
    for row in rows.values():
        assert all(-1 <= delay <= PERIOD_SECONDS for delay in row.result["delays"]), (row.title, row.result)

    # Each scenario's own expectation, beyond never silent and never both.
    def verdict(row: str, offset: int) -> str:
        return str(rows[row].result["verdicts"][a + offset])

    assert [verdict("operator", o) for o in (0, 1, 2)] == ["ran once"] * 3
    assert [verdict("early", o) for o in (0, 1, 2)] == ["ran once"] * 3
    assert [verdict("killed", o) for o in (0, 1, 2)] == ["ran once"] * 3
    assert rows["killed"].result["released after"] <= RENEWAL_SECONDS
    for name in ("database", "long", "manual"):
        assert [verdict(name, o) for o in (0, 1, 2)] == ["ran once", "reported missed", "ran once"], name
    assert [verdict("controllers", o) for o in (2, 3, 4)] == ["ran once", "reported missed", "ran once"]

    # One slot as each operator's status tells it: the winner's run Succeeded, the loser's
    # Skipped naming the winner's holder and fence, its Job removed (no Failed Job left for
    # generic alerting), the per-run Events Normal as the API server stores them.
    early = rows["early"]
    job = slot_job(early.name, a)
    runs = {c.name: wait_for(f"{job} final in {c.name}'s status", lambda c=c: next((
        run for run in gcj_status(c, early.namespace, early.name).get("recentRuns") or []
        if run["job"] == job and "finishedAt" in run), None), timeout=60) for c in both}
    [winner] = [c for c in both if runs[c.name]["outcome"] == "Succeeded"]
    [loser] = [c for c in both if c is not winner]
    won, skipped = runs[winner.name], runs[loser.name]
    assert (skipped["outcome"], skipped["holder"], skipped["fence"], skipped["slot"]) == (
        "Skipped", won["holder"], won["fence"], a), (won, skipped)
    assert won["holder"].startswith(f"{winner.name}/") and won["manual"] is False, won
    wait_for(f"{loser.name}'s operator removes the skipped Job {job}",
             lambda: loser.job(early.namespace, job) is None, timeout=60)
    assert [j["metadata"]["name"] for j in loser.jobs(early.namespace) if job_finished(j) == "Failed"] == []
    for cluster, reason in ((winner, "RunSucceeded"), (loser, "RunSkipped")):
        [event] = [e for e in cluster.api.get(f"/api/v1/namespaces/{early.namespace}/events")["items"]
                   if e["reason"] == reason and f" {job} " in e["message"]]
        assert event["type"] == "Normal" and event["involvedObject"]["kind"] == "GuardedCronJob", event
    # Suspended through the GuardedCronJob: the operator passes it on to the CronJob.
    for cluster in both:
        cluster.kubectl("patch", contract.PLURAL, early.name, "-n", early.namespace, "--type=merge",
                        "-p", '{"spec": {"suspend": true}}')
    for cluster in both:
        wait_for(f"{early.name} suspended in {cluster.name}", lambda c=cluster: (c.get(
            f"/apis/batch/v1/namespaces/{early.namespace}/cronjobs/{early.name}") or {}).get(
            "spec", {}).get("suspend") is True and any(
            cond["type"] == "MissedRun" and cond["reason"] == "Suspended"
            for cond in gcj_status(c, early.namespace, early.name).get("conditions") or []), timeout=60)

    # A report is the condition's transition (its Event) and the counter, in each cluster.
    for row in rows.values():
        for cluster in both:
            events = missed_events(cluster, row.namespace, row.name)
            assert all(e["type"] == "Warning" for e in events), events
            counted = missed_counter(operators[cluster.name], row.namespace, row.name)
            assert counted == len(events), (row.name, cluster.name, counted, events)
    for operator in operators.values():
        assert operator.refusals() == [], operator.refusals()
