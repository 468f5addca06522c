"""Opening the database connection, and bounding every call on it, with errors that
never carry the password.

Every wait on the database has a bound (docs/design.md, "Bounded waits"):
- connecting: libpq's `connect_timeout` (whole seconds, at least 2);
- a dead peer on an idle or busy connection: TCP keepalives and `tcp_user_timeout`, so
  the kernel drops a connection whose packets go unacknowledged;
- a call that gets no answer at all (a partition that swallows packets, or a server that
  accepts TCP but never answers, where the kernel sees nothing wrong):
  `call_with_deadline`, a client-side watchdog that shuts the socket down at the
  deadline so libpq's blocked read returns an error.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from guardedcron.contract import ENV_DSN
from guardedcron.guard.client_key import install_client_key
from guardedcron.guard.errors import BadInput, DatabaseUnavailable, SchemaOutdated

if TYPE_CHECKING:
    import psycopg

# SQLSTATEs meaning "the schema is not there (or is older than this tool's functions)".
SCHEMA_MISSING_STATES = {"3F000", "42P01", "42883"}

# libpq never waits less than this for a connection (connectDBComplete).
LIBPQ_MIN_CONNECT_TIMEOUT = 2
# An idle connection whose peer vanished is found after 5 + 3 x 2 = 11 s of silence.
KEEPALIVES_IDLE_SECONDS = 5
KEEPALIVES_INTERVAL_SECONDS = 2
KEEPALIVES_COUNT = 3
# Data sent but not acknowledged for this long: the kernel drops the connection. This
# catches a real partition (no ACKs) during a call; a proxy or a hung server that
# acknowledges but never answers is left to the client-side deadline.
TCP_USER_TIMEOUT_MS = 10_000

T = TypeVar("T")


def resolve_dsn(dsn: str | None) -> str:
    value = dsn if dsn is not None else os.environ.get(ENV_DSN, "")
    if not value.strip():
        raise BadInput(f"no database given: set {ENV_DSN} or pass --dsn")
    return value


# What a message says instead of a DSN whose userinfo libpq read in the wrong places.
MALFORMED_DSN = "<DSN not shown: an '@' or '/' in its user or password is not percent-encoded (%40, %2F)>"
MALFORMED_DETAILS = "the driver's message is not shown (it may quote part of the password)"
# Where libpq puts what follows an unencoded '@' or '/' of a URI's userinfo: an '@' in
# any of these means part of the userinfo (maybe of the password) landed there.
_READ_FROM_USERINFO = ("host", "hostaddr", "port", "dbname")


def parsed_from_userinfo(parts: dict[str, Any]) -> bool:
    """libpq read part of a URI's user or password as its host, port or database."""
    return any("@" in str(parts.get(key) or "") for key in _READ_FROM_USERINFO)


def describe(dsn: str) -> str:
    """`user@host:port/dbname`, for messages: everything but the password, and nothing
    at all that libpq may have read out of a malformed userinfo."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # an unparseable DSN must not be echoed back: it may hold a password
        return "<unparseable DSN>"
    if parsed_from_userinfo(parts):
        return MALFORMED_DSN
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    dbname = parts.get("dbname") or parts.get("user") or "?"
    user = parts.get("user")
    who = f"{user}@" if user else ""
    return f"{who}{host}:{port}/{dbname}"


def scrub(message: str, dsn: str) -> str:
    """Remove the password (and the raw DSN) from a message, whatever produced it. From a
    DSN with a malformed userinfo libpq may quote any piece of the password as a host,
    port or database name: its message is then not shown at all."""
    from psycopg.conninfo import conninfo_to_dict

    secrets = [dsn]
    try:
        parts = conninfo_to_dict(dsn)
        if parsed_from_userinfo(parts):
            return MALFORMED_DETAILS
        password = parts.get("password")
        if password:
            secrets.append(str(password))
    except Exception:
        pass
    for secret in secrets:
        if secret:
            message = message.replace(secret, "***")
    return message


def last_line(message: str) -> str:
    """The last non-empty line: libpq puts the server's own reason (FATAL: ...) there."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else message.strip()


# libpq's words for a failed TLS check, and what to check. libpq may add a line of advice
# after its reason, so last_line could lose the reason itself.
_WHERE_THE_CA_COMES_FROM = "sslrootcert or PGSSLROOTCERT; in a pod, spec.lease.tls.caSecretRef"
TLS_FAILURES = (
    ("certificate verify failed",
     f"server certificate verification failed: it is not signed by the CA given "
     f"({_WHERE_THE_CA_COMES_FROM})"),
    ("does not match host name",
     "server certificate verification failed: the DSN's host must be a name in the "
     "server's certificate"),
    ("root certificate file",
     f"sslmode verify-ca and verify-full need the server's CA ({_WHERE_THE_CA_COMES_FROM})"),
)
# libpq's prefix of each failed attempt: `connection to server at "h", port p failed: `.
_ATTEMPT_PREFIX = "failed: "


def connect_failure_reason(message: str) -> str:
    """One line saying why a connection failed: for a failed TLS check, libpq's reason
    and what to check; otherwise libpq's last line."""
    for line in message.splitlines():
        for words, advice in TLS_FAILURES:
            if words in line:
                reason = line.rsplit(_ATTEMPT_PREFIX, 1)[-1].strip()
                return f"TLS: {advice}: {reason}"
    return last_line(message)


def libpq_connect_timeout(seconds: float) -> int:
    """What libpq will really wait: whole seconds, never less than 2."""
    return max(LIBPQ_MIN_CONNECT_TIMEOUT, math.ceil(seconds))


def connection_options(connect_timeout: float) -> dict[str, Any]:
    """libpq settings of every connection the guard and the operator open.

    No `options` startup parameter (connection poolers such as PgBouncer refuse it) and
    no server-side prepared statements (a pooler in transaction mode hands the next
    statement to another server connection, where the prepared one does not exist).
    """
    return {
        "autocommit": True,
        "connect_timeout": libpq_connect_timeout(connect_timeout),
        "keepalives": 1,
        "keepalives_idle": KEEPALIVES_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVES_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
        "prepare_threshold": None,
    }


def check_dsn(dsn: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise BadInput("the database DSN cannot be parsed (value not shown)") from None


def connect(dsn: str, connect_timeout: float) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection: each guard call is its own short transaction."""
    import psycopg

    check_dsn(dsn)
    install_client_key()
    try:
        return psycopg.connect(dsn, application_name="guardedcron", **connection_options(connect_timeout))
    except psycopg.OperationalError as exc:
        reason = connect_failure_reason(scrub(str(exc), dsn))
        raise DatabaseUnavailable(f"cannot reach database {describe(dsn)}: {reason}") from None


def no_answer(dsn: str, seconds: float) -> DatabaseUnavailable:
    return DatabaseUnavailable(f"no answer from database {describe(dsn)} within {round(seconds, 1):g} s")


class SocketWatchdog:
    """Shuts a connection's socket down at a deadline unless the call ended first.

    Shutting the socket down (not closing it: the descriptor stays libpq's) makes the
    read libpq is blocked in return at once, whatever the network does; the call then
    fails and the connection is unusable. A lock orders the two ends, so the socket is
    never touched once the caller has moved on (and may have closed and reused the fd).
    """

    def __init__(self, fd: int, seconds: float) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._ended = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self.fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def fire(self) -> None:
        with self._lock:
            if self._ended:
                return
            self.fired = True
            shut_down_socket(self._fd)

    def end(self) -> bool:
        """The call is over: disarm, and say whether the deadline cut it."""
        self._timer.cancel()
        with self._lock:
            self._ended = True
            return self.fired


def shut_down_socket(fd: int) -> None:
    duplicate = socket.socket(fileno=os.dup(fd))
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already disconnected: the blocked read has its error anyway
    finally:
        duplicate.close()


def call_with_deadline(
    conn: psycopg.Connection[tuple[Any, ...]],
    dsn: str,
    seconds: float,
    call: Callable[[psycopg.Connection[tuple[Any, ...]]], T],
) -> T:
    """`call(conn)`, answered within `seconds` or failed with DatabaseUnavailable (69).

    Database errors become the guard's errors (raise_for_database). A call cut by the
    deadline may or may not have taken effect in the database, like any lost connection.
    """
    watchdog = SocketWatchdog(conn.fileno(), seconds)
    watchdog.start()
    try:
        result = call(conn)
    except Exception as exc:
        if watchdog.end():
            raise no_answer(dsn, seconds) from None
        raise_for_database(exc, dsn)
        raise
    watchdog.end()
    return result


def raise_for_database(exc: Exception, dsn: str) -> None:
    """Turn a failed call into the guard's errors: schema missing (78), or the connection
    lost in the middle of the call, e.g. the server restarting or the backend cut (69)."""
    import psycopg

    raise_for_schema(exc, dsn)
    if isinstance(exc, psycopg.OperationalError):
        reason = exc.diag.message_primary or str(exc).strip().split("\n")[0]
        raise DatabaseUnavailable(
            f"lost the connection to database {describe(dsn)}: {scrub(reason, dsn)}"
        ) from None


def raise_for_schema(exc: Exception, dsn: str) -> None:
    """Turn 'function/table does not exist' into the schema exit code."""
    import psycopg

    if isinstance(exc, psycopg.Error) and exc.sqlstate in SCHEMA_MISSING_STATES:
        raise SchemaOutdated(
            f"the guardedcron schema in {describe(dsn)} is missing or older than this tool; "
            "run `guardedcron db migrate`"
        ) from None
