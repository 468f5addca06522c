"""The README's first command, `guardedcron demo`, on the real local control planes."""

from __future__ import annotations

import subprocess

import pytest

from guardedcron_devenv.binaries import Paths
from tests.support import GUARDEDCRON


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_demo_runs_each_slot_once_across_two_clusters(kube_binaries: Paths) -> None:
    """Two clusters fire the same minute: one run charges, the other is skipped naming it."""
    result = subprocess.run(
        [GUARDEDCRON, "demo", "--local", "--slots", "1"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    won = [line for line in output.splitlines() if "guard won the lease" in line]
    # The loser meets the winner's lease, or, when the winner ended before the loser's
    # guard asked (a loaded node), its claim on the minute: either refusal names the run.
    skipped = [
        line
        for line in output.splitlines()
        if "Skipped -- lease-held" in line or "Skipped -- slot-claimed" in line
    ]
    assert len(won) == 1 and "workload Succeeded" in won[0], output
    assert len(skipped) == 1, output
    winner_cluster = won[0].split("]")[0].lstrip("[")
    assert f"{winner_cluster}/billing/nightly-invoices-" in skipped[0], output
    assert "invoice batches charged: 1; charged twice: 0" in output
    assert "Succeeded" in output and "Skipped" in output  # the status columns of kubectl get gcj
