"""Where the operator's Kubernetes credentials come from: kopf's own login helpers.

Inside a pod, the service account; elsewhere, the kubeconfig (`$KUBECONFIG` or
`~/.kube/config`), as kubectl would. The helpers read small files, so they run in a
worker thread. The result is a `kopf.ConnectionInfo`, which kopf uses for its
watches and `KubeClient` for the operator's own calls.
"""

from __future__ import annotations

import asyncio

import kopf


async def discover_credentials(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    return await asyncio.to_thread(_discover, settings)


def _discover(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    info = kopf.login_with_service_account(settings=settings)
    return info if info is not None else kopf.login_with_kubeconfig(settings=settings)
