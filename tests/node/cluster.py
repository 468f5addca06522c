"""What the node tier's tests share: the one cluster with a real node."""

from __future__ import annotations

from dataclasses import dataclass

from guardedcron_devenv.controlplane import ControlPlane
from guardedcron_devenv.node import PodNetwork, RealNode

# A subnet of our own for the pod bridge; nothing else on this machine uses it.
POD_SUBNET = "10.213.0.0/24"
# Setting up the user path (image build, imports, chart install) and a run on a busy
# 2-core machine take longer than the suite's default 300 s per test.
NODE_TEST_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class NodeCluster:
    network: PodNetwork
    plane: ControlPlane
    node: RealNode
