"""Manual runs as Jobs (builders/manual.py): names the guard reads as manual, one name
per trigger token, and the Job kubectl would make from the CronJob, guard included."""

from __future__ import annotations

import random
import re
import string
from typing import Any

import pytest

from guardedcron import contract
from guardedcron.builders.manual import (
    ManualRunError,
    build_manual_job,
    manual_job_name,
    suffix_from_bytes,
    trigger_job_name,
    trigger_token_problem,
)
from guardedcron.status.runs import is_manual, scheduled_slot
from tests.support.gcj import base_gcj, put
from tests.support.status_world import live_cronjob

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def guard_reads_slot(job_name: str, cronjob: str) -> bool:
    """The guard's own test (cli/guard_commands.py): `<cronjob>-<digits>` has a slot."""
    return re.fullmatch(re.escape(cronjob) + r"-(\d+)", job_name) is not None


def test_names_are_valid_never_look_scheduled_and_fit() -> None:
    rng = random.Random(7)
    alphabet = string.ascii_lowercase + string.digits + "-"
    for _ in range(3000):
        size = rng.randint(1, contract.CRONJOB_NAME_MAX)
        middle = "".join(rng.choice(alphabet) for _ in range(max(0, size - 2)))
        cronjob = (rng.choice(string.ascii_lowercase) + middle + rng.choice(string.digits))[:size]
        name = manual_job_name(cronjob, suffix_from_bytes(rng.randbytes(5)))
        assert len(name) <= 63 and DNS_LABEL.match(name), name
        assert not guard_reads_slot(name, cronjob), (cronjob, name)
        assert name.startswith(cronjob[:40])


def test_a_long_cronjob_name_is_shortened() -> None:
    cronjob = "a" * 52
    name = manual_job_name(cronjob, "bcdfg")
    assert name == "a" * 50 + "-manual-bcdfg" and len(name) == 63


def test_a_suffix_must_end_in_a_letter() -> None:
    with pytest.raises(ValueError, match="end in a letter"):
        manual_job_name("x", "bcd12")


def test_one_token_one_name() -> None:
    first = trigger_job_name("nightly-invoices", "uid-1", "2025-06-01")
    assert first == trigger_job_name("nightly-invoices", "uid-1", "2025-06-01")
    assert first.startswith("nightly-invoices-manual-")
    others = {trigger_job_name("nightly-invoices", "uid-1", str(n)) for n in range(2000)}
    assert len(others) == 2000 and first not in others
    assert trigger_job_name("nightly-invoices", "uid-2", "2025-06-01") != first


@pytest.mark.parametrize(("token", "problem"), [
    ("x" * 254, "254 characters long; at most 253"),
    ("a\nb", "control characters"),
])
def test_bad_tokens(token: str, problem: str) -> None:
    assert problem in (trigger_token_problem(token) or "")


def test_good_tokens() -> None:
    for token in ("1", "2025-06-01T10:00:00Z", "release v1.2 — rerun", "x" * 253):
        assert trigger_token_problem(token) is None


def cronjob(**changes: Any) -> dict[str, Any]:
    body = live_cronjob(put(base_gcj(), "spec.jobTemplate.metadata", {
        "labels": {"team": "billing"}, "annotations": {"owner": "ops"}}))
    body["metadata"] |= changes
    return body


def test_the_job_is_kubectls_with_our_marks() -> None:
    source = cronjob()
    job = build_manual_job(source, job_name="nightly-invoices-manual-bcdfg", started_by="cli",
                           token="t1")
    meta = job["metadata"]
    assert meta["name"] == "nightly-invoices-manual-bcdfg" and meta["namespace"] == "billing"
    assert meta["annotations"] == {"owner": "ops", "cronjob.kubernetes.io/instantiate": "manual",
                                   contract.ANNOTATION_MANUAL: "cli", contract.ANNOTATION_TRIGGER: "t1"}
    assert meta["labels"] == source["spec"]["jobTemplate"]["metadata"]["labels"]
    assert meta["labels"][contract.LABEL_NAME] == "nightly-invoices"
    assert meta["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "CronJob",
                                        "name": "nightly-invoices", "uid": source["metadata"]["uid"],
                                        "controller": True}]
    assert job["spec"] == source["spec"]["jobTemplate"]["spec"]
    assert job["spec"]["template"]["spec"]["initContainers"][0]["name"] == contract.GUARD_CONTAINER
    # The status code reads it as a manual run without a slot.
    assert is_manual(job) and scheduled_slot(job) is None


def test_a_cronjob_without_the_guard_gives_no_job() -> None:
    source = cronjob()
    source["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"] = []
    with pytest.raises(ManualRunError, match="guardedcron-guard"):
        build_manual_job(source, job_name="x-manual-bcdfg", started_by="cli")


def test_a_cronjob_not_read_from_the_api_server_gives_no_job() -> None:
    source = cronjob()
    del source["metadata"]["uid"]
    with pytest.raises(ManualRunError, match="uid"):
        build_manual_job(source, job_name="x-manual-bcdfg", started_by="cli")
