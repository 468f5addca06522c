"""What guardedcron adds to every generated CronJob, so a template may not claim it."""

from __future__ import annotations

from guardedcron import contract

RESERVED_CONTAINER_NAMES = (contract.GUARD_CONTAINER, contract.KEEPER_CONTAINER)
RESERVED_VOLUME_NAME = contract.RUN_VOLUME
RESERVED_MOUNT_PATH = contract.RUN_DIR


def owner_labels(name: str) -> dict[str, str]:
    """Labels on the CronJob, its Job template and pod template, naming the GuardedCronJob."""
    return {contract.LABEL_NAME: name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE}
