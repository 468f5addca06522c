"""The chaos run: contenders race for leases under faults; the database must show no double work.

Default size: at least 500 contended runs and 50 faults of each kind, within the CI
budget on 2 cores. `--chaos-long` runs ten times that; `--chaos-seed N` replays a plan.
"""

from __future__ import annotations

import psycopg
import pytest

from guardedcron_devenv.pgbouncer import PgBouncer
from guardedcron_devenv.postgres import ThrowawayPostgres
from guardedcron_devenv.toxiproxy import Toxiproxy
from tests.chaos.harness import Chaos
from tests.chaos.invariants import check_all
from tests.chaos.plan import Plan
from tests.chaos.report import figures, render, run_problems
from tests.chaos.schema import create_database

pytestmark = pytest.mark.chaos


def test_no_double_work_under_faults(
    restartable_postgres: ThrowawayPostgres,
    toxiproxy: Toxiproxy,
    chaos_pooler: PgBouncer,
    chaos_plan: Plan,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    say(f"\nchaos: seed {chaos_plan.seed} (replay with: pytest tests/chaos --chaos-seed {chaos_plan.seed})")
    dsn = create_database(restartable_postgres, "chaos")
    chaos = Chaos(restartable_postgres, dsn, chaos_plan, say, toxiproxy, chaos_pooler)
    chaos.run()
    chaos.store_attempts()
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = check_all(conn)
    values = figures(chaos, found)
    say("chaos figures: " + render(values))
    problems = run_problems(chaos)
    assert not found.violations, "\n".join(found.violations) + f"\n(process traces in {chaos.state.workdir})"
    assert not problems, "\n".join(problems) + f"\n(process traces in {chaos.state.workdir})"
    assert values["duplicates"] == 0
    chaos.remove_traces()
