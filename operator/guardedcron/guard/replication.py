"""Whether a failover of the server a guard reaches could lose acknowledged wins.

A win is durable on the server that acknowledged it (the schema forces a durable commit,
waiting for the standbys named in `synchronous_standby_names`). A standby that is not
among them may lack the last wins when it is promoted; their slots then run again
(fences stay safe: docs/design.md, "Guarantees"). One cheap query tells:

- a primary with WAL senders connected and `synchronous_standby_names` empty: every
  standby is asynchronous, so a failover can lose wins. Said.
- standbys connected that the server reports as `async` or `potential` (visible only to
  roles with pg_monitor's rights; to others pg_stat_replication shows rows without
  details): a failover to one of those can lose wins. Said.
- no WAL sender at all: quiet. Either a lone server (nothing to fail over to) or a
  managed service replicating below PostgreSQL (AWS RDS Multi-AZ DB instance, Cloud SQL
  HA, Azure zone-redundant HA), which is synchronous. A standby that is disconnected at
  that moment, or fed from an archive, is not seen either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

QUERY = (
    "SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),"
    " (SELECT count(*) FROM pg_stat_replication),"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('async', 'potential'))"
)


@dataclass(frozen=True)
class Replication:
    in_recovery: bool
    synchronous_standby_names: str
    standbys: int  # WAL senders connected (pg_stat_replication's rows, visible to every role)
    asynchronous: int  # of those, reported async or potential (0 when the role may not see)

    def warning(self) -> str | None:
        """One line when a failover of this server can lose acknowledged wins, else None."""
        if self.in_recovery or self.standbys == 0:
            return None
        if not self.synchronous_standby_names.strip():
            return (
                f"this primary streams to {self.standbys} standby(s) without synchronous replication "
                "(synchronous_standby_names is empty): a failover to one of them can lose acquired "
                "leases and run their slots again; see the README's database section"
            )
        if self.asynchronous:
            return (
                f"{self.asynchronous} of this primary's {self.standbys} standby(s) are not synchronous: "
                "a failover to one of them can lose acquired leases and run their slots again; see the "
                "README's database section"
            )
        return None

    def fields(self) -> dict[str, Any]:
        return {
            "in_recovery": self.in_recovery,
            "standbys": self.standbys,
            "synchronous_standby_names": self.synchronous_standby_names,
            "failover_can_lose_wins": self.warning() is not None,
        }


def replication_of(conn: psycopg.Connection[tuple[Any, ...]]) -> Replication | None:
    """The server's replication as this connection sees it; None if the server refuses
    the query (an unusual server or pooler): this is advice, and must never stop a guard.
    A connection lost meanwhile is raised, so the caller reports it as such (69)."""
    import psycopg

    try:
        row = conn.execute(QUERY).fetchone()
    except psycopg.OperationalError:
        raise
    except psycopg.Error:
        return None
    if row is None:
        return None
    return Replication(bool(row[0]), str(row[1]), int(row[2]), int(row[3]))
