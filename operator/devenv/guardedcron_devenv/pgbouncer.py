"""A real PgBouncer in transaction mode, in front of a throwaway PostgreSQL.

Most shared PostgreSQL installations sit behind a transaction pooler: between two
transactions a client's server connection goes back to the pool, and the next
transaction may run on another one. Whatever a client leaves on a server session
(prepared statements, `SET`, advisory locks, temporary tables, `LISTEN`) is then gone,
or worse, seen by someone else. Only the real program shows whether the guard survives
that, so this runs Debian's `pgbouncer` (installed by `.ci/bootstrap`), never a stand-in:

- its own folder (config, auth file, log, pid file), removed on exit;
- `pool_mode = transaction`, a small pool, and `server_round_robin = 1`: idle server
  connections are handed out in turn rather than the last one used first, so two
  consecutive transactions of one client land on different server sessions whenever the
  pool holds more than one (`open_server_connections`), the harshest order for state
  that leaks across transactions;
- `auth_file` with the server's own user and password (SCRAM to the client and to the
  server); the file is readable by the pooler alone;
- a free port on 127.0.0.1; the start waits at most STARTUP_TIMEOUT_S for the port to
  accept, and fails with the pooler's log (which never holds the password) otherwise.

`show("POOLS")` etc. read the admin console (simple query protocol: the console
refuses extended-protocol statements).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from guardedcron_devenv.postgres import SERVER_USER, free_port

PGBOUNCER: Final = Path(os.environ.get("GUARDEDCRON_PGBOUNCER", "/usr/sbin/pgbouncer"))
LOOPBACK: Final = "127.0.0.1"
ADMIN_DATABASE: Final = "pgbouncer"
# Bounds on every wait in this module (seconds).
STARTUP_TIMEOUT_S: Final = 10.0
STOP_TIMEOUT_S: Final = 5.0
PROBE_TIMEOUT_S: Final = 0.5
CONSOLE_CONNECT_TIMEOUT_S: Final = 2
LOG_TAIL_LINES: Final = 30
# Server connections per (database, user) pool: fewer than the clients the tests open,
# so clients really take turns on server sessions.
DEFAULT_POOL_SIZE: Final = 2


class PgBouncerError(RuntimeError):
    """The pooler is not installed, did not start, or its console refused a command."""


def pgbouncer_version(binary: Path = PGBOUNCER) -> str:
    """`PgBouncer 1.18.0`, from the binary itself."""
    check_installed(binary)
    result = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    return result.stdout.splitlines()[0].strip() if result.stdout else f"unknown ({result.stderr.strip()})"


def check_installed(binary: Path = PGBOUNCER) -> None:
    if not os.access(binary, os.X_OK):
        raise PgBouncerError(
            f"pgbouncer is not installed at {binary}; run `bash .ci/bootstrap` "
            "(it installs Debian's pgbouncer package) or set GUARDEDCRON_PGBOUNCER"
        )


def quoted(value: str) -> str:
    """A value in PgBouncer's auth file: double quotes, doubled inside."""
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """Start with `with PgBouncer(server_dsn) as pooler:`; `pooler.dsn_for(dsn)` goes through it.

    `server_dsn` names the server and the one user (with its password) the pooler lets in;
    every database of that server is reachable through the pooler under its own name.
    """

    def __init__(
        self,
        server_dsn: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        settings: Mapping[str, str] | None = None,
        binary: Path = PGBOUNCER,
    ) -> None:
        params = conninfo_to_dict(server_dsn)
        self.user = str(params["user"])
        self._password = str(params.get("password") or "")
        self.server_host = str(params.get("host") or LOOPBACK)
        self.server_port = int(params.get("port") or 5432)
        self.pool_size = pool_size
        self.extra_settings = dict(settings or {})
        self.binary = binary
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="guardedcron-pgbouncer-"))
        self.config = self.base / "pgbouncer.ini"
        self.auth_file = self.base / "userlist.txt"
        self.log = self.base / "pgbouncer.log"
        self.pid_file = self.base / "pgbouncer.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    # --- life cycle -----------------------------------------------------------------
    def __enter__(self) -> PgBouncer:
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def settings(self) -> dict[str, str]:
        values = {
            "listen_addr": LOOPBACK,
            "listen_port": str(self.port),
            "unix_socket_dir": "",  # loopback TCP only, like every other part of the dev environment
            "auth_type": "scram-sha-256",
            "auth_file": str(self.auth_file),
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": str(self.pool_size),
            "max_client_conn": "500",
            "server_round_robin": "1",
            "logfile": str(self.log),
            "pidfile": str(self.pid_file),
            "log_connections": "0",
            "log_disconnections": "0",
        }
        values.update(self.extra_settings)
        return values

    def write_config(self) -> None:
        lines = [
            "; guardedcron throwaway pooler",
            "[databases]",
            f"* = host={self.server_host} port={self.server_port}",
            "",
            "[pgbouncer]",
            *(f"{key} = {value}" for key, value in self.settings().items()),
        ]
        self.config.write_text("\n".join(lines) + "\n")
        self.auth_file.touch(mode=0o600)
        self.auth_file.write_text(f"{quoted(self.user)} {quoted(self._password)}\n")
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root: it runs as the server's user, and reads
            # and writes only its own folder.
            user = pwd.getpwnam(SERVER_USER)
            for path in (self.base, self.config, self.auth_file):
                os.chown(path, user.pw_uid, user.pw_gid)

    def command(self) -> list[str]:
        switch_user = ["-u", SERVER_USER] if os.geteuid() == 0 else []
        return [str(self.binary), *switch_user, str(self.config)]

    def start(self) -> None:
        check_installed(self.binary)
        self.write_config()
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise PgBouncerError(
                    f"pgbouncer exited with {self.proc.returncode} at start-up:\n{stderr}{self.log_tail()}"
                )
            if self.accepts():
                return
            time.sleep(0.05)
        raise PgBouncerError(
            f"pgbouncer did not accept connections on {LOOPBACK}:{self.port} within "
            f"{STARTUP_TIMEOUT_S:g} s; its log:\n{self.log_tail()}"
        )

    def accepts(self) -> bool:
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), SIGKILL if it is still there after the bound."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
        finally:
            if proc.stderr is not None:
                proc.stderr.close()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log written)"

    # --- connection strings -----------------------------------------------------------
    def dsn_for(self, dsn: str) -> str:
        """The same connection string (URI or key=value), pointed at the pooler."""
        params = conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params["host"] = LOOPBACK
        params["port"] = str(self.port)
        return make_conninfo("", **params)

    # --- the admin console --------------------------------------------------------------
    @contextmanager
    def console(self) -> Iterator[Any]:
        import psycopg

        conn = psycopg.connect(
            host=LOOPBACK,
            port=self.port,
            dbname=ADMIN_DATABASE,
            user=self.user,
            password=self._password,
            autocommit=True,
            connect_timeout=CONSOLE_CONNECT_TIMEOUT_S,
            cursor_factory=psycopg.ClientCursor,  # the console speaks the simple query protocol only
        )
        try:
            yield conn
        finally:
            conn.close()

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on the admin console (POOLS, SERVERS, CLIENTS, STATS, ...), as dicts."""
        if not what.replace("_", "").isalpha():
            raise PgBouncerError(f"not a SHOW command: {what!r}")
        with self.console() as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
