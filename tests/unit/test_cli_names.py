"""The CLI's check of a GuardedCronJob's NAME and namespace (trigger, backfill, kubectl gcj
runs): one rule, the one admission and `guardedcron.spec` apply, checked before any
request (the API server in these kubeconfigs is a closed port: reaching it would be 69)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from guardedcron.cli.cluster_options import name_problems
from guardedcron.objects import is_dns_label, is_dns_subdomain
from guardedcron.spec import SpecError, parse_guarded_cronjob
from guardedcron.status.times import format_time
from tests.support.gcj import base_gcj

BIN = Path(sys.executable).parent
# Not "nightly\n": spec/parse.py's pattern ends in `$`, which lets a trailing newline
# through (the API server refuses it; the CLI does too, below).
NAMES = ["nightly", "a", "nightly.v2", "a-b.c-d", "x" * 52, "x" * 53, "Nightly", "night_ly",
         "-nightly", "nightly-", "a..b", ".a", "a.", "", "ni ghtly", "é"]


@pytest.mark.parametrize(("text", "label", "subdomain"), [
    ("a", True, True), ("a-1", True, True), ("a.b", False, True), ("x" * 63, True, True),
    ("x" * 64, False, True), (".".join(["x" * 63] * 4), False, False),  # 255 characters
    ("a\n", False, False), ("A", False, False), ("-a", False, False), ("a..b", False, False),
    ("", False, False),
])
def test_kubernetes_name_rules(text: str, label: bool, subdomain: bool) -> None:
    assert (is_dns_label(text), is_dns_subdomain(text)) == (label, subdomain)


def spec_accepts_name(name: str) -> bool:
    gcj = base_gcj()
    gcj["metadata"]["name"] = name
    try:
        parse_guarded_cronjob(gcj)
    except SpecError as error:
        return "metadata.name" not in str(error)
    return True


@pytest.mark.parametrize("name", NAMES)
def test_name_is_accepted_exactly_when_the_spec_accepts_it(name: str) -> None:
    assert (name_problems(name, None) == []) == spec_accepts_name(name)



# A backfill range of yesterday: inside the age a backfill may reach (the guard's claims).
YESTERDAY = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=1)
COMMANDS = {
    "trigger": ["guardedcron", "trigger"],
    "backfill": ["guardedcron", "backfill", "--since", format_time(YESTERDAY),
                 "--until", format_time(YESTERDAY + timedelta(hours=1))],
    "kubectl gcj runs": ["kubectl-gcj", "runs"],
    "kubectl gcj status": ["kubectl-gcj", "status"],
    "kubectl gcj suspend": ["kubectl-gcj", "suspend"],
    "kubectl gcj report": ["kubectl-gcj", "report"],
}


def run(command: list[str], config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / command[0]), *command[1:], *extra, "--kubeconfig", str(config)],
                          capture_output=True, text=True, env=dict(os.environ), timeout=60, check=False)


@pytest.mark.parametrize("command", COMMANDS.values(), ids=list(COMMANDS))
@pytest.mark.parametrize(("extra", "said"), [
    (["Not_A_Name"], "NAME 'Not_A_Name' is not a valid name"),
    (["nightly\n"], "NAME 'nightly\\n' is not a valid name"),
    (["x" * 53], "at most 52 characters"),
    (["nightly", "-n", "x" * 64], "--namespace 'xxxx"),
    (["nightly", "-n", "team.a"], "--namespace 'team.a' is not a valid name"),
])
def test_a_bad_name_is_64_before_any_request(
        command: list[str], extra: list[str], said: str, closed_kubeconfig: Path) -> None:
    result = run(command, closed_kubeconfig, *extra)
    assert result.returncode == 64, result
    assert said in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.parametrize("command", COMMANDS.values(), ids=list(COMMANDS))
def test_a_dotted_name_is_looked_up(command: list[str], closed_kubeconfig: Path) -> None:
    """A GuardedCronJob may be named like nightly.v2 (a DNS subdomain): it gets as far as
    the API server (here unreachable: 69), as a plain name does."""
    for name in ("nightly.v2", "nightly"):
        result = run(command, closed_kubeconfig, name, "-n", "team-a")
        assert result.returncode == 69, result
        assert "cannot reach the API server" in result.stderr
