"""What the `kubectl gcj` commands share: their failure, their login to the API server,
reading one GuardedCronJob, and the runs and tables they print (pure, for the tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from guardedcron import contract
from guardedcron.cli.kubeconfig import KubeconfigError, connection_info
from guardedcron.contract import EXIT_FAILURE, EXIT_UNAVAILABLE
from guardedcron.kube import GUARDED_CRONJOBS, ApiError, ApiUnreachable, KubeClient, NotFound

PROG = "kubectl gcj"
RUN_COLUMNS = ("JOB", "OUTCOME", "FENCE", "MANUAL", "STARTED", "FINISHED", "REASON")
# kubectl's name for a GuardedCronJob in its messages: `guardedcronjob.guardedcron.io/NAME`.
RESOURCE_NAME = f"{contract.KIND.lower()}.{contract.API_GROUP}"


class PluginFailed(Exception):
    """One line for stderr; `code` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


@asynccontextmanager
async def cluster(kubeconfig: str | None, context: str | None,
                  namespace: str | None) -> AsyncIterator[tuple[KubeClient, str]]:
    """A client logged in with the kubeconfig context, and the namespace to use (-n, else
    the context's); API failures inside become PluginFailed (69 when unreachable)."""
    try:
        info = await asyncio.to_thread(connection_info, kubeconfig, context)
    except KubeconfigError as error:
        raise PluginFailed(str(error), error.code) from None
    client = KubeClient(info)
    try:
        yield client, namespace or info.default_namespace or "default"
    except ApiUnreachable as error:
        raise PluginFailed(f"cannot reach the API server: {error}", EXIT_UNAVAILABLE) from None
    except ApiError as error:
        raise PluginFailed(f"the API server refused: {error}") from None
    finally:
        await client.close()


async def get_guarded_cronjob(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    try:
        return await client.get(GUARDED_CRONJOBS, namespace, name)
    except NotFound:
        raise PluginFailed(f"GuardedCronJob {namespace}/{name} not found") from None


def where_of(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def runs_of(gcj: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a GuardedCronJob's status lists (its last run when the list is empty)."""
    namespace, name = where_of(gcj)
    status = gcj.get("status") or {}
    runs = status.get("recentRuns") or ([status["lastRun"]] if status.get("lastRun") else [])
    return [{"namespace": namespace, "guardedCronJob": name, **run} for run in runs
            if isinstance(run, dict)]


def run_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """A run's RUN_COLUMNS cells."""
    return (str(row.get("job", "")), str(row.get("outcome", "")),
            "" if row.get("fence") is None else str(row["fence"]),
            "yes" if row.get("manual") else "no", str(row.get("startedAt", "")),
            str(row.get("finishedAt", "")), " ".join(str(row.get("reason", "")).split()))


def table_lines(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """kubectl's plain table: columns as wide as their widest cell, three spaces apart."""
    table = [tuple(heads), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(heads))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in table]
