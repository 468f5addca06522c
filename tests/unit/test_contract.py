"""The wire contract (guardedcron.contract): each fact the guard, the builders and the
status code share is spelled once, there, and both sides read it alike.

- the slot rule: one function; the guard and the status code read the same slot from
  the same Job name, and refuse the same names;
- the termination messages: what the real guard and keeper processes write (against a
  real database) is read back by the operator's reader with every field intact, for
  every outcome they have;
- no second spelling: a scan of the package's source for the reason words, the
  instantiate annotation and the slot pattern outside the contract module;
- the contract stays at the bottom: it imports only the standard library.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guardedcron import contract
from guardedcron.builders import build_pod_failure_policy
from guardedcron.cli.guard_commands import parse_integer, parse_slot
from guardedcron.contract import (
    BIGINT_MAX,
    AcquireReason,
    GuardOutcome,
    KeeperOutcome,
    SlotOutOfRange,
    slot_from_job_name,
)
from guardedcron.guard.errors import BadInput
from guardedcron.status.reports import read_guard_message, read_keeper_message
from guardedcron.status.runs import Outcome, RunRecord, classify_run, is_manual, scheduled_slot
from tests.support import GUARDEDCRON, REPO, run_cli
from tests.support.status_objects import CRONJOB, container_status, job, pod, terminated

PACKAGE = REPO / "operator" / "guardedcron"


# --- the slot a Job name stands for ------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "cronjob", "slot"),
    [
        ("nightly-29345678", "nightly", 29345678),
        ("nightly-0", "nightly", 0),
        ("nightly-007", "nightly", 7),
        (f"c-{BIGINT_MAX}", "c", BIGINT_MAX),
        (f"c-0000{BIGINT_MAX}", "c", BIGINT_MAX),  # leading zeros do not count
        ("a-b-12", "a-b", 12),
        ("a-b-12", "a", None),  # another CronJob's Job (`a-b`), not a slot of `a`
        ("nightly-manual-x7k2p", "nightly", None),
        ("nightly-", "nightly", None),
        ("nightly-12a", "nightly", None),
        ("nightly--12", "nightly", None),
        ("nightly-+12", "nightly", None),
        ("nightly12", "nightly", None),
        ("other-12", "nightly", None),
        ("nightly-12", "", None),
        ("nightly-١٢٣", "nightly", None),  # digits, but not ASCII: no Job name has them
        ("c-" + "0" * 5000 + "1", "c", 1),  # more digits than int() converts, nearly all zeros
    ],
)
def test_the_slot_rule(name: str, cronjob: str, slot: int | None) -> None:
    assert slot_from_job_name(name, cronjob) == slot


@pytest.mark.parametrize("digits", [str(BIGINT_MAX + 1), "9" * 30, "1" + "0" * 5000])
def test_a_minute_past_a_bigint_is_refused_with_its_digits(digits: str) -> None:
    with pytest.raises(SlotOutOfRange) as caught:
        slot_from_job_name(f"c-{digits}", "c")
    assert caught.value.digits == digits
    assert len(str(caught.value)) < 120  # names the value, never all 5000 digits of it


def guard_slot(name: str, cronjob: str) -> int | None:
    """The slot `guardedcron acquire --job-name NAME --cronjob CRONJOB` claims."""
    return parse_slot(argparse.Namespace(slot=None, job_name=name, cronjob=cronjob))


def status_slot(name: str) -> int | None:
    """The slot the status code gives a Job of that name made by CRONJOB, no annotations."""
    body = job(slot_time=None, created=datetime(2025, 6, 2, tzinfo=UTC), name=name)
    return scheduled_slot(body)


@given(st.text("0123456789", min_size=1, max_size=25) | st.text(min_size=0, max_size=12))
def test_the_guard_and_the_status_read_the_same_slot(suffix: str) -> None:
    # Before the contract held the rule, the guard read any number of ASCII digits and
    # the status at most 12 (and any Unicode digit): a 13-digit minute was a slot to the
    # guard and a manual run to the status.
    name = f"{CRONJOB}-{suffix}"
    try:
        claimed = guard_slot(name, CRONJOB)
    except BadInput as refused:
        assert "must be from 0 to" in str(refused)
        claimed = None  # the guard exits 64 and claims nothing; the status shows no slot
    assert status_slot(name) == claimed
    body = job(slot_time=None, created=datetime(2025, 6, 2, tzinfo=UTC), name=name)
    assert is_manual(body) is (claimed is None)


def test_the_guard_refuses_a_minute_past_a_bigint_in_the_job_name() -> None:
    with pytest.raises(BadInput, match=f"the scheduled minute in --job-name must be from 0 to {BIGINT_MAX}"):
        guard_slot(f"c-{BIGINT_MAX + 1}", "c")


@pytest.mark.parametrize("option", ["--slot", "--retain-days"])
def test_leading_zeros_past_int_conversion_limit_are_read_not_crashed_on(option: str) -> None:
    # `int()` refuses strings of more than 4300 digits; the guard exited 70 (internal error).
    text = "0" * 5000 + "7"
    assert parse_integer(option, text, minimum=0, maximum=BIGINT_MAX) == 7
    assert parse_integer(option, "-" + text, minimum=-10, maximum=0) == -7


def test_a_slot_past_year_9999_is_a_scheduled_run_without_a_time() -> None:
    # A minute that fits a bigint but not a datetime: classify_run used to raise here
    # ("year ... is out of range") and fail the whole pass.
    name = f"{CRONJOB}-999999999999"
    record = classify_run(job(slot_time=None, created=datetime(2025, 6, 2, tzinfo=UTC), name=name), [])
    assert (record.outcome, record.slot, record.scheduled_at, record.manual) == (
        Outcome.RUNNING, 999999999999, None, False)
    assert type(record).from_status(record.to_status()) == record


# --- the termination messages, written by the real processes, read by the operator --------

def guard_answer(args: list[str], dsn: str, log: Path) -> tuple[int, dict[str, object]]:
    log.write_text("")  # exists, as /dev/termination-log does in a pod
    result = run_cli(args, dsn=dsn, env={contract.ENV_TERMINATION_LOG: str(log)})
    message: dict[str, object] = json.loads(log.read_text())
    return result.code, message


def acquire(lock: str, holder: str, *more: str) -> list[str]:
    return ["acquire", "--lock", lock, "--holder", holder, "--lease-seconds", "30", *more]


# Every key the guard or the keeper may write: the contract's KEY_* names.
CONTRACT_KEYS = {value for name, value in vars(contract).items() if name.startswith("KEY_")}


def test_every_guard_outcome_round_trips_through_the_status_reader(dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    # case: argv, exit code, and what the operator must read (outcome, holder, slot, requester)
    cases = {
        "acquired": (acquire("rt", "ns/a", "--slot", "7"), contract.EXIT_OK,
                     ("acquired", "ns/a", 7, None)),
        "lease-held": (acquire("rt", "ns/b"), contract.EXIT_NOT_ACQUIRED,
                       ("skipped", "ns/a", None, "ns/b")),
        "slot-claimed": (acquire("rt-slot", "ns/c", "--slot", "7"), contract.EXIT_NOT_ACQUIRED,
                         ("skipped", "ns/a", 7, "ns/c")),
        "bad input": (acquire("rt", "ns/d", "--slot", "-1"), contract.EXIT_USAGE,
                      ("error", "ns/d", None, None)),
    }
    # The slot-claimed case needs slot 7 of `rt-slot` to have run and ended already.
    assert run_cli(acquire("rt-slot", "ns/a", "--slot", "7"), dsn=dsn).code == contract.EXIT_OK
    assert run_cli(["release", "--lock", "rt-slot", "--holder", "ns/a", "--fence", "1"], dsn=dsn).code == 0
    seen: set[str] = set()
    for case, (args, exit_code, expected) in cases.items():
        code, written = guard_answer(args, dsn, log)
        assert code == exit_code, (case, written)
        assert set(written) <= CONTRACT_KEYS, case
        read = read_guard_message(log.read_text())
        assert read.problem is None, case
        assert (read.outcome, read.holder, read.slot, read.requester) == expected, case
        assert (read.fence is None) is (read.outcome == GuardOutcome.ERROR), case  # the winner's fence
        assert (read.outcome, read.holder, read.fence, read.slot, read.requester, read.reason) == (
            written.get(contract.KEY_OUTCOME), written.get(contract.KEY_HOLDER),
            written.get(contract.KEY_FENCE), written.get(contract.KEY_SLOT),
            written.get(contract.KEY_REQUESTER), written.get(contract.KEY_REASON),
        ), case
        assert read.outcome in set(GuardOutcome), case
        seen.add(str(read.outcome))
        if read.outcome != GuardOutcome.ERROR:
            assert read.reason in set(AcquireReason), case
    assert seen == set(GuardOutcome)  # a new outcome needs its case here


def test_the_skip_reasons_round_trip_into_the_run_record(dsn: str, tmp_path: Path) -> None:
    """The reason words the guard writes are the ones the status turns into a Skipped run's reason."""
    log = tmp_path / "termination-log"
    assert run_cli(acquire("rr", "ns/a", "--slot", "5"), dsn=dsn).code == 0
    assert guard_answer(acquire("rr", "ns/b", "--slot", "6"), dsn, log)[0] == contract.EXIT_NOT_ACQUIRED
    held = log.read_text()
    assert run_cli(["release", "--lock", "rr", "--holder", "ns/a", "--fence", "1"], dsn=dsn).code == 0
    assert guard_answer(acquire("rr", "ns/c", "--slot", "5"), dsn, log)[0] == contract.EXIT_NOT_ACQUIRED
    claimed = log.read_text()
    assert read_guard_message(held).reason == AcquireReason.LEASE_HELD
    assert read_guard_message(claimed).reason == AcquireReason.SLOT_CLAIMED
    assert skipped_run(held).reason == "lease held by ns/a (fence 1)"
    assert skipped_run(claimed).reason == "slot 5 already ran under ns/a (fence 1)"


def skipped_run(message: str) -> RunRecord:
    """The run of a Job whose guard exited 75 with this termination message."""
    at = datetime(2025, 6, 2, 1, 30, tzinfo=UTC)
    body = job(slot_time=None, created=at, name=f"{CRONJOB}-5")
    guard = container_status(contract.GUARD_CONTAINER, state={
        "terminated": terminated(contract.EXIT_NOT_ACQUIRED, at, at, message)})
    record = classify_run(body, [pod(body, created=at, phase="Failed", init_statuses=[guard])])
    assert record.outcome == Outcome.SKIPPED
    return record


def keeper(dsn: str, log: Path, fence: str, lease_seconds: str) -> subprocess.Popen[str]:
    log.write_text("")
    return subprocess.Popen(
        [GUARDEDCRON, "keep", "--lock", "kp", "--holder", "ns/a", "--fence", fence,
         "--lease-seconds", lease_seconds, "--dsn", dsn],
        env={k: v for k, v in os.environ.items() if k != contract.ENV_DSN}
        | {contract.ENV_TERMINATION_LOG: str(log)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def started(process: subprocess.Popen[str]) -> None:
    """Wait until the keeper says it is keeping (its first line), or has exited (end of file)."""
    assert process.stderr is not None
    line = process.stderr.readline()
    assert "keeping lock" in line, line


def stopped(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=contract.KEEPER_STOP_SECONDS + 10)
    return process.returncode


def test_every_keeper_outcome_round_trips_through_the_status_reader(dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert run_cli(acquire("kp", "ns/a"), dsn=dsn).code == 0
    answers: dict[KeeperOutcome, dict[str, object]] = {}

    released = keeper(dsn, log, "1", "60")
    started(released)
    assert stopped(released) == contract.EXIT_OK
    answers[KeeperOutcome.RELEASED] = json.loads(log.read_text())

    assert run_cli(acquire("kp", "ns/a"), dsn=dsn).code == 0  # fence 2
    not_holder = keeper(dsn, log, "2", "60")
    started(not_holder)  # it renews every 20 s: the lease moves on under it before that
    assert run_cli(["release", "--lock", "kp", "--holder", "ns/a", "--fence", "2"], dsn=dsn).code == 0
    assert run_cli(acquire("kp", "ns/b"), dsn=dsn).code == 0  # fence 3, someone else's
    assert stopped(not_holder) == contract.EXIT_OK
    answers[KeeperOutcome.NOT_HOLDER] = json.loads(log.read_text())

    lost = keeper(dsn, log, "2", "3")  # its first renewal is refused: the fence moved on
    lost.communicate(timeout=30)
    assert lost.returncode == contract.EXIT_LEASE_LOST
    answers[KeeperOutcome.LOST] = json.loads(log.read_text())

    for outcome, written in answers.items():
        assert set(written) <= CONTRACT_KEYS, outcome
        read = read_keeper_message(json.dumps(written))
        assert read.problem is None and read.outcome == outcome == written[contract.KEY_OUTCOME]
        assert (read.holder, read.fence, read.reason) == (
            written[contract.KEY_HOLDER], written[contract.KEY_FENCE], written.get(contract.KEY_REASON))
    assert set(answers) == set(KeeperOutcome)  # a new outcome needs its case here
    assert read_keeper_message(json.dumps(answers[KeeperOutcome.LOST])).reason


# --- podFailurePolicy: the builder's rule order is the index the status reads ----------------

def test_the_fail_job_rules_sit_at_the_indexes_the_status_reads() -> None:
    rules = build_pod_failure_policy()["rules"]
    assert rules[contract.SKIP_RULE_INDEX]["onExitCodes"]["values"] == [contract.EXIT_NOT_ACQUIRED]
    assert rules[contract.GUARD_ERROR_RULE_INDEX]["onExitCodes"]["values"] == sorted(
        contract.GUARD_ERROR_EXIT_CODES)
    assert contract.EXIT_NOT_ACQUIRED not in contract.GUARD_ERROR_EXIT_CODES


# --- one spelling: the scan ---------------------------------------------------------------

# The words of the guard's and keeper's messages. Those in the first set mean nothing else.
ONLY_WIRE_WORDS = {"already-held", "lease-held", "slot-claimed", "row-busy", "not-holder"}
# These are words of other vocabularies too; each place that spells one for another
# vocabulary is named here with that vocabulary, so a new spelling has to say what it is.
COMMON_WORDS = {"acquired", "skipped", "error", "lost", "released"}
OTHER_VOCABULARIES = {
    ("spec/settings.py", "error"): "a log level",
    ("cli/operator.py", "error"): "a log level",
    ("observability/metrics.py", "skipped"): "a metric label value",
    ("status/history.py", "skipped"): "a status.runCounts key",
    ("status/backfill.py", "skipped"): "a status.backfill key",
    ("status/history.py", "lost"): "a status.runCounts key",
    ("status/transitions.py", "skipped"): "an Event's wording",
    ("guard/history.py", "lost"): "a run-history row's outcome (written by the SQL)",
}
INSTANTIATE = "cronjob.kubernetes.io/instantiate"
SLOT_PATTERNS = (r"-(\d", r"-([0-9]", r"-([\d")


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def second_spellings(source: str, where: str) -> Iterator[str]:
    """Each string literal of `source` (comments and docstrings aside) that spells a wire fact."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        text = node.value
        spelled = (
            text in ONLY_WIRE_WORDS
            or (text in COMMON_WORDS and (where, text) not in OTHER_VOCABULARIES)
            or INSTANTIATE in text
            or any(pattern in text for pattern in SLOT_PATTERNS)
        )
        if spelled:
            yield f"{where}:{node.lineno}: {text!r}"


def package_spellings(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where != "contract.py":
            found += second_spellings(path.read_text(), where)
    return found


def test_wire_facts_are_spelled_only_in_the_contract() -> None:
    assert package_spellings(PACKAGE) == []


def test_the_scan_finds_a_second_spelling() -> None:
    source = '''
"""A docstring may say slot-claimed and cronjob.kubernetes.io/instantiate."""
# so may a comment: row-busy
import re
def f(reason):
    """Nor this: lease-held."""
    if reason == "slot-claimed":
        return {"outcome": "skipped"}
    return re.fullmatch(r"x-(\\d{1,12})", reason), {"cronjob.kubernetes.io/instantiate": "manual"}
'''
    assert [line.split(": ", 1)[1] for line in second_spellings(source, "status/example.py")] == [
        "'slot-claimed'", "'skipped'", "'x-(\\\\d{1,12})'", "'cronjob.kubernetes.io/instantiate'"]
    assert list(second_spellings('LEVELS = {"error": 40}', "spec/settings.py")) == []


def test_the_sql_answers_only_the_contracts_reasons() -> None:
    """The SQL functions cannot import the contract; their reason words are checked here."""
    sql = "\n".join(path.read_text() for path in sorted((PACKAGE / "guard" / "sql").glob("*.sql")))
    words = set(re.findall(r"'([a-z-]+)'::text", sql))
    assert words and words <= set(AcquireReason)
    assert set(AcquireReason) - words == {AcquireReason.ROW_BUSY}  # the library's own answer


# --- the contract is the bottom layer -------------------------------------------------------

@pytest.mark.parametrize("module", ["contract.py", "objects.py"])
def test_the_contract_imports_only_the_standard_library(module: str) -> None:
    imported = set()
    for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)
