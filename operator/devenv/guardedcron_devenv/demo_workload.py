"""The demo's workload: charge one invoice batch per run, fenced and keyed by slot.

Run by the process-kubelet as the demo GuardedCronJob's container. It reads the lease
the guard wrote, and inside one transaction checks its fence and inserts a row whose
key is the run's slot (or a manual key), so a second charge of the same slot would
fail loudly instead of billing twice.
"""

from __future__ import annotations

import os
import sys

import psycopg

from guardedcron.contract import RUN_DIR
from guardedcron.guard.errors import StaleFenceError
from guardedcron.guard.fence import check_fence, read_lease

INVOICE_TABLE = """
CREATE TABLE IF NOT EXISTS demo_invoice_batches (
    dedupe_key text PRIMARY KEY,
    fence      bigint      NOT NULL,
    holder     text        NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def main() -> int:
    lease = read_lease(os.environ.get("GUARDEDCRON_RUN_DIR", RUN_DIR))
    key = f"slot-{lease.slot}" if lease.slot is not None else f"manual-{lease.holder}"
    with psycopg.connect(os.environ["GUARDEDCRON_DSN"]) as conn:
        conn.execute(INVOICE_TABLE)
        conn.commit()
        try:
            with conn.transaction():
                check_fence(conn, lease.lock, lease.fence)
                conn.execute(
                    "INSERT INTO demo_invoice_batches (dedupe_key, fence, holder) VALUES (%s, %s, %s)",
                    (key, lease.fence, lease.holder),
                )
        except StaleFenceError as exc:
            print(f"refused by the fence: {exc}", file=sys.stderr)
            return 3
    print(f"charged invoice batch {key} as {lease.holder} with fence {lease.fence}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
