"""The TLS client key where libpq accepts it.

libpq refuses a private key file that its group or others may read, unless root owns it
with at most mode 0640. A Kubernetes Secret volume gives the guard's user (65532, no
fsGroup required of the user's pod) a root-owned file it can read only because it is
world-readable (defaultMode 0644), so libpq would refuse it. With
GUARDEDCRON_TLS_KEY_SOURCE set, the guard copies the key from there to PGSSLKEY, mode
0600, before every connection (docs/design.md, "Generated CronJob", TLS).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from guardedcron.contract import ENV_TLS_KEY_SOURCE
from guardedcron.guard.errors import BadInput

LIBPQ_KEY_ENV = "PGSSLKEY"


def install_client_key() -> None:
    """Copy the key named by GUARDEDCRON_TLS_KEY_SOURCE to PGSSLKEY with mode 0600; nothing
    when it is unset. The copy is written beside its target and renamed over it, so a
    connection never reads half a key (the keeper reconnects while it runs)."""
    source = os.environ.get(ENV_TLS_KEY_SOURCE)
    if not source:
        return
    target = os.environ.get(LIBPQ_KEY_ENV)
    if not target:
        raise BadInput(f"{ENV_TLS_KEY_SOURCE} is set but {LIBPQ_KEY_ENV} (where the guard "
                       "copies the TLS client key for libpq) is not")
    try:
        key = Path(source).read_bytes()
        # mkstemp creates the file with mode 0600: the key is never readable by others.
        descriptor, partial = tempfile.mkstemp(dir=Path(target).parent, prefix=".partial-")
    except OSError as exc:
        raise BadInput(f"cannot copy the TLS client key {source} to {target}: "
                       f"{exc.strerror or exc}") from None
    try:
        with os.fdopen(descriptor, "wb") as copy:
            copy.write(key)
        os.replace(partial, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise BadInput(f"cannot copy the TLS client key {source} to {target}: "
                       f"{exc.strerror or exc}") from None
