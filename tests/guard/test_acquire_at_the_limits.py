"""A lease is won only when the run can start: every input at its limits is refused before
the database is touched, files that cannot be written after a win give the lease back,
and SIGINT ends a command in one line.

Each input here used to win the lease (and its slot), print `"acquired": true`, then end
in exit 70 without `lease.json` or `fence`: the slot spent and nothing run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from guardedcron.contract import BIGINT_MAX, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from guardedcron.schedule.dst import SKIPPED_SLOT_BASE, slot_of
from guardedcron_devenv.postgres import ThrowawayPostgres
from tests.guard.test_cli_contract import check_contract, database_state, run, secrets_of
from tests.support import GUARDEDCRON, run_cli

LAST_MINUTE = 4_223_371_679  # 9999-12-31T23:59Z, the last minute a datetime holds
BASE = ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "30"]


def slot_of_wall(year: int, month: int, day: int, hour: int, minute: int) -> int:
    """A wall time's own minute count (read as if UTC): the offset of a skipped time's key."""
    return slot_of(datetime(year, month, day, hour, minute, tzinfo=UTC))


LIMITS = [
    # id, arguments, the option the message names
    ("slot-at-the-bigint-maximum", ["--slot", str(BIGINT_MAX)], "--slot"),
    ("slot-past-year-9999", ["--slot", str(LAST_MINUTE + 1)], "--slot"),
    ("slot-of-year-11476", ["--slot", "5000000000"], "--slot"),
    ("job-name-at-the-bigint-maximum", ["--cronjob", "c", "--job-name", f"c-{BIGINT_MAX}"], "--job-name"),
    ("zone-that-is-a-folder", ["--time-zone", "Europe"], "--time-zone"),
    ("zone-that-is-a-nested-folder", ["--time-zone", "America/Argentina", "--slot", "7"], "--time-zone"),
    ("once-with-a-huge-slot",
     ["--time-zone", "Europe/Stockholm", "--repeated-time", "Once", "--slot", str(BIGINT_MAX)], "--slot"),
    ("last-minute-in-a-zone-ahead-of-utc",
     ["--slot", str(LAST_MINUTE), "--time-zone", "Pacific/Kiritimati"], "--slot"),
    ("last-minute-once-in-a-zone-ahead-of-utc",
     ["--slot", str(LAST_MINUTE), "--time-zone", "Pacific/Kiritimati", "--repeated-time", "Once"], "--slot"),
    ("last-skipped-key-in-a-zone-behind-utc",
     ["--slot", str(SKIPPED_SLOT_BASE + LAST_MINUTE), "--time-zone", "America/New_York",
      "--run-kind", "skipped-time"], "--slot"),
]


@pytest.mark.parametrize(("arguments", "option"), [pytest.param(a, o, id=i) for i, a, o in LIMITS])
def test_an_input_whose_time_or_zone_cannot_be_written_is_refused_before_the_database(
    arguments: list[str], option: str, dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    before = database_state(dsn)
    answer = run([*BASE, *arguments, "--out", str(out)], dsn, tmp_path)
    assert (answer.code, answer.stdout) == (EXIT_USAGE, ""), answer
    assert answer.stderr.count("\n") == 1, answer
    assert answer.stderr.startswith(f"guardedcron acquire: {option}"), answer
    check_contract(answer, "acquire", secrets_of(postgres))
    assert json.loads(answer.termination)["exitCode"] == EXIT_USAGE
    assert database_state(dsn) == before
    assert not out.exists()


@pytest.mark.parametrize(
    "arguments",
    [
        ["--slot", str(LAST_MINUTE)],  # 9999-12-31T23:59Z
        ["--slot", str(LAST_MINUTE), "--time-zone", "America/New_York", "--repeated-time", "Once"],
        ["--slot", "0", "--time-zone", "Pacific/Kiritimati", "--repeated-time", "Once"],
        ["--slot", "0", "--time-zone", "Etc/GMT+12"],
        ["--slot", str(SKIPPED_SLOT_BASE + slot_of_wall(2026, 3, 29, 2, 30)),
         "--time-zone", "Europe/Stockholm", "--run-kind", "skipped-time"],
    ],
    ids=["last-minute-utc", "last-minute-once-behind-utc", "epoch-once-ahead-of-utc", "epoch-behind-utc",
         "a-skipped-wall-time"],
)
def test_the_limits_that_can_be_written_win_with_their_files(
    arguments: list[str], dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    answer = run([*BASE, *arguments, "--out", str(out)], dsn, tmp_path)
    assert answer.code == EXIT_OK, answer
    lease = json.loads((out / "lease.json").read_text())
    assert int((out / "fence").read_text()) == lease["fence"] == json.loads(answer.stdout)["fence"]
    assert lease["scheduled_time_utc"] is not None


def lease_and_run(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT l.released_at IS NOT NULL, l.locked_until <= clock_timestamp(), r.outcome, r.reason"
            " FROM guardedcron.leases l JOIN guardedcron.runs r ON r.id = l.run_id WHERE l.lock_name = 'j'"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_win_whose_files_cannot_be_written_is_released_and_said(
    dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    """The folder passes the check, but `lease.json` cannot be put in place (a folder of
    that name is in the way, as a full disk or a vanished volume would fail it)."""
    out = tmp_path / "run"
    (out / "lease.json").mkdir(parents=True)
    log = tmp_path / "termination-log"
    log.write_text("")
    result = run_cli([*BASE, "--slot", "7", "--out", str(out)], dsn=dsn,
                     env={"GUARDEDCRON_TERMINATION_LOG": str(log)})
    assert result.code == EXIT_INTERNAL, result
    assert result.stdout == "", "no `acquired: true` for a run that cannot start"
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "could not write the lease files" in result.stderr and "the lease was released" in result.stderr
    message = json.loads(log.read_text())
    assert (message["outcome"], message["exitCode"]) == ("error", EXIT_INTERNAL)
    assert "the lease was released" in message["reason"]
    released, ended, outcome, reason = lease_and_run(dsn)
    assert (released, ended, outcome) == (True, True, "failed")
    assert "lease files" in str(reason)
    assert not (out / "fence").exists()
    # The lease is free at once; the slot stays claimed (the history says why it did not run).
    assert run_cli([*BASE[:3], "--holder", "b", *BASE[5:], "--slot", "8"], dsn=dsn).code == EXIT_OK
    for secret in secrets_of(postgres):
        assert secret not in result.stdout + result.stderr + log.read_text()


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("command", [BASE, ["release", "--lock", "j", "--holder", "a", "--fence", "1"]],
                         ids=["acquire", "release"])
def test_sigint_ends_a_command_in_one_line_with_its_exit_code(command: list[str], tmp_path: Path) -> None:
    """Interrupted while it waits for a server that accepts but never answers."""
    log = tmp_path / "termination-log"
    log.write_text("")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(30)
        port = server.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "GUARDEDCRON_DSN"}
        env["GUARDEDCRON_DSN"] = f"postgresql://jobs:Hunter2-sEcReT@127.0.0.1:{port}/db"
        env["GUARDEDCRON_TERMINATION_LOG"] = str(log)
        # SIGINT at its default in the guard, as at a terminal: a suite started in the
        # background by a non-interactive shell has it ignored, and children inherit that.
        proc = subprocess.Popen([GUARDEDCRON, *command, "--connect-timeout", "30"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_sigint)
        try:
            accepted, _ = server.accept()  # the guard is connecting
            with accepted:
                proc.send_signal(signal.SIGINT)
                stdout, stderr = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED == 130, stderr
    assert stderr == f"guardedcron {command[0]}: interrupted (SIGINT)\n" and stdout == ""
    if command[0] == "acquire":
        assert json.loads(log.read_text())["exitCode"] == EXIT_INTERRUPTED
    assert "Hunter2" not in stdout + stderr + log.read_text()


def test_sigint_while_the_files_are_written_gives_the_lease_back(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(out: Path, lease: dict[str, object]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("guardedcron.guard.outputs.write_lease_files", interrupted)
    answer = run([*BASE, "--out", str(tmp_path / "run")], dsn, tmp_path)
    assert (answer.code, answer.stdout) == (EXIT_INTERRUPTED, ""), answer
    assert answer.stderr == (
        "guardedcron acquire: interrupted (SIGINT) before the lease files were written; "
        "the lease was released and its run recorded failed\n"
    )
    assert json.loads(answer.termination)["exitCode"] == EXIT_INTERRUPTED
    assert lease_and_run(dsn)[:3] == (True, True, "failed")
