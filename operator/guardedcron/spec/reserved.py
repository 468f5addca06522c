"""What guardedcron adds to every generated CronJob, so a template may not claim it."""

from __future__ import annotations

from guardedcron import contract

RESERVED_CONTAINER_NAMES = (contract.GUARD_CONTAINER, contract.KEEPER_CONTAINER)
RESERVED_VOLUME_NAME = contract.RUN_VOLUME
# Reserved whether or not spec.lease.tls is set, so that setting it never clashes with a
# volume the template already has.
RESERVED_TLS_VOLUME_NAMES = (contract.TLS_CA_VOLUME, contract.TLS_CLIENT_VOLUME,
                             contract.TLS_KEY_VOLUME)
RESERVED_MOUNT_PATH = contract.RUN_DIR


def owner_labels(name: str) -> dict[str, str]:
    """Labels on the CronJob, its Job template and pod template, naming the GuardedCronJob."""
    return {contract.LABEL_NAME: name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE}
