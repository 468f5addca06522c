"""`make test`'s lanes (operator/devenv/guardedcron_devenv/suite.py): every test in exactly
one lane, the figures of each session read back, a failing lane failing the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from guardedcron_devenv.suite import (
    NO_TESTS_COLLECTED,
    Lane,
    Outcome,
    phases,
    read_outcome,
    run_lanes,
    suite_exit_code,
    summary,
)
from tests.support import REPO


def test_every_test_is_in_one_lane_and_the_clocked_ones_in_their_own() -> None:
    quiet, (clock, e2e, rest), (node,) = phases()
    assert quiet[0].paths == ("tests",) and quiet[0].marker_args == ("-m", "quiet_machine")
    for lane in (clock, e2e, rest, node):
        assert lane.marker_args == ("-m", "not quiet_machine")
        assert all((REPO / path).exists() for path in (*lane.paths, *lane.ignored))
    # The clock-bound files are e2e files, run by their lane and by no other.
    assert all(path.startswith("tests/e2e/") for path in clock.paths)
    assert set(e2e.ignored) == set(clock.paths)
    # The rest is tests/ minus what the other lanes name: a new tier lands there.
    assert rest.paths == ("tests",)
    assert set(rest.ignored) == {*e2e.paths, *node.paths}
    assert not set(e2e.paths) & set(node.paths)


def test_a_lanes_figures_come_from_the_session_it_ran(tmp_path: Path) -> None:
    lane = Lane("one", ("tests/unit/test_suite_order.py",))
    [outcome] = run_lanes([lane], REPO, tmp_path)
    assert (outcome.lane, outcome.exit_code) == ("one", 0)
    assert outcome.counts == {"passed": 2}
    assert set(outcome.tier_seconds) == {"tests/unit"}


def test_lanes_run_side_by_side_and_each_keeps_its_own_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each test waits for the other to have started: run one after the other, both would fail.
    meet = ("import pathlib, time\n"
            "def meet(me, other):\n"
            "    pathlib.Path(me).touch()\n"
            "    deadline = time.monotonic() + 60\n"
            "    while not pathlib.Path(other).exists():\n"
            "        assert time.monotonic() < deadline, 'the other lane never started'\n"
            "        time.sleep(0.05)\n")
    (tmp_path / "test_ok.py").write_text(meet + "def test_ok():\n    meet('ok', 'bad')\n")
    (tmp_path / "test_bad.py").write_text(meet + "def test_bad():\n    meet('bad', 'ok')\n    assert False\n")
    (tmp_path / "test_slow.py").write_text("import time\ndef test_slow():\n    time.sleep(5)\n")
    (tmp_path / "reports").mkdir()
    lanes = [Lane("slow", ("test_slow.py",), marker_args=()),
             Lane("ok", ("test_ok.py",), marker_args=()), Lane("bad", ("test_bad.py",), marker_args=()),
             Lane("none", ("test_ok.py",), marker_args=("-k", "nothing_by_this_name"))]
    slow, *outcomes = run_lanes(lanes, tmp_path, tmp_path / "reports")
    assert [(o.lane, o.exit_code) for o in outcomes] == [("ok", 0), ("bad", 1), ("none", NO_TESTS_COLLECTED)]
    # Each lane's time is its own, not the time until the lane before it ended.
    assert slow.exit_code == 0 and max(o.seconds for o in outcomes) < slow.seconds
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith(" bad | ") and "test_bad.py F" in line for line in printed)
    assert any(line.startswith("  ok | ") and "1 passed" in line for line in printed)
    assert suite_exit_code(outcomes) == 1
    assert suite_exit_code([outcomes[0], outcomes[2]]) == NO_TESTS_COLLECTED


def test_the_summary_adds_the_lanes_up(tmp_path: Path) -> None:
    missing = read_outcome("gone", -9, 3.0, tmp_path / "never-written.json")
    assert (missing.counts, missing.tier_seconds) == ({}, {})
    lines = summary([
        Outcome("a", 0, 100.0, {"passed": 3}, {"tests/e2e": 90.0, "tests/unit": 5.0}),
        Outcome("b", 1, 50.0, {"passed": 1, "failed": 2}, {"tests/e2e": 40.0}),
        missing,
    ], wall_seconds=130.0)
    assert "         b: exit 1,     50 s, 2 failed, 1 passed" in lines
    assert "      gone: exit -9,      3 s, no report" in lines
    assert "     130 s  tests/e2e" in lines and "       5 s  tests/unit" in lines
    assert lines[-1] == "all: 2 failed, 4 passed in 130 s (2 min) of wall-clock time"


def test_with_arguments_it_is_one_plain_pytest_session(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one(): pass\n")
    proc = subprocess.run([sys.executable, "-m", "guardedcron_devenv.suite", "test_one.py", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "lane by lane" not in proc.stdout
