"""A throwaway PostgreSQL server for the demo, the tests and the benchmarks.

It runs the server binaries of Debian's `postgresql` package (installed by
`.ci/bootstrap`) from a temporary data folder on a free loopback port. PostgreSQL
refuses to run as root, so when we are root the server runs as the `postgres`
user that the package creates.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from guardedcron_devenv.pki import KeyPair

SERVER_USER = "postgres"


def find_server_bin() -> Path:
    """The newest installed PostgreSQL server's bin folder."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    override = os.environ.get("GUARDEDCRON_PG_BIN")
    if override:
        return Path(override)
    if not candidates:
        raise RuntimeError(
            "no PostgreSQL server found under /usr/lib/postgresql; run `bash .ci/bootstrap` "
            "(it installs Debian's postgresql package) or set GUARDEDCRON_PG_BIN"
        )
    return Path(candidates[-1]).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayPostgres:
    """Start with `with ThrowawayPostgres() as pg:`; everything is removed on exit."""

    def __init__(
        self,
        *,
        durable: bool = False,
        max_connections: int = 400,
        superuser: str = "guardedcron",
        settings: Sequence[tuple[str, str]] = (),
        client_networks: Sequence[str] = (),
        tls: KeyPair | None = None,
        client_ca: Path | None = None,
    ) -> None:
        """`client_networks`: subnets (e.g. a pod network) allowed to log in with a password;
        the server also listens on each one's first address, which must be this machine's.
        `tls`: the server's certificate and key; TCP logins must then use TLS. `client_ca`
        (with `tls`): TCP logins must also show a client certificate signed by this CA
        whose common name is the role (`clientcert=verify-full`). The Unix socket stays
        open without either, for the administrative connections (create_database)."""
        if client_ca is not None and tls is None:
            raise ValueError("client_ca needs tls: client certificates are a part of TLS")
        self.bin = find_server_bin()
        self.client_networks = tuple(ipaddress.ip_network(n) for n in client_networks)
        self.durable = durable
        self.max_connections = max_connections
        self.superuser = superuser
        self.password = secrets.token_urlsafe(18)
        self.port = free_port()
        self.extra_settings = list(settings)
        self.tls = tls
        self.client_ca = client_ca
        self.base = Path(tempfile.mkdtemp(prefix="guardedcron-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.log = self.base / "server.log"
        self._run_as: list[str] = []
        if os.geteuid() == 0:
            self._run_as = ["runuser", "-u", SERVER_USER, "--"]
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.socket_dir.mkdir()
        if self._run_as:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.socket_dir, user.pw_uid, user.pw_gid)

    # --- life cycle -----------------------------------------------------------------
    def __enter__(self) -> ThrowawayPostgres:
        try:
            self.init()
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    def _pg(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._run_as, str(self.bin / tool), *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def init(self) -> None:
        pwfile = self.base / "pw"
        pwfile.write_text(self.password + "\n")
        if self._run_as:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        self._pg(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.superuser,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        addresses = ["127.0.0.1", *(str(next(net.hosts())) for net in self.client_networks)]
        settings = {
            "listen_addresses": f"'{','.join(addresses)}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(self.max_connections),
            "shared_buffers": "'128MB'",
            "log_min_messages": "warning",
            "log_connections": "off",
        }
        if not self.durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        settings.update(self._tls_settings())
        settings.update(dict(self.extra_settings))
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# guardedcron throwaway server\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")
        hba_path = self.data / "pg_hba.conf"
        # The first matching line decides: the TLS rules go before initdb's own.
        hba_path.write_text("".join(self._tls_hba_lines()) + hba_path.read_text())
        with hba_path.open("a") as hba:
            for network in self.client_networks:
                hba.write(f"host all all {network} scram-sha-256\n")

    def _tls_settings(self) -> dict[str, str]:
        """ssl = on with copies of the files in the data folder: the server must own its key
        and refuses one that others may read."""
        if self.tls is None:
            return {}
        files = {"ssl_cert_file": ("server.crt", self.tls.cert), "ssl_key_file": ("server.key", self.tls.key)}
        if self.client_ca is not None:
            files["ssl_ca_file"] = ("client-ca.crt", self.client_ca)
        settings = {"ssl": "on"}
        for setting, (name, source) in files.items():
            copy = self.data / name
            shutil.copyfile(source, copy)
            copy.chmod(0o600)
            if self._run_as:
                user = pwd.getpwnam(SERVER_USER)
                os.chown(copy, user.pw_uid, user.pw_gid)
            settings[setting] = f"'{copy}'"
        return settings

    def _tls_hba_lines(self) -> list[str]:
        if self.tls is None:
            return []
        proof = " clientcert=verify-full" if self.client_ca is not None else ""
        return ["hostnossl all all all reject\n", f"hostssl all all all scram-sha-256{proof}\n"]

    def start(self) -> None:
        result = self._pg(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr}\n{self.log_tail()}")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        result = self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            mode,
            "-w",
            "-t",
            "60",
            "restart",
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not restart: {result.stderr}\n{self.log_tail()}")

    def kill(self) -> None:
        """kill -9 the whole server at once (the postmaster and every process it started), as
        when its machine dies: nothing more is written, flushed or sent to standbys."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # it forks nothing more while its children are listed
        children = [int(pid) for pid in subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()]  # fmt: skip
        for pid in [postmaster, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in [postmaster, *children]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL processes outlived SIGKILL: {postmaster}, {children}")
            time.sleep(0.01)
        (self.data / "postmaster.pid").unlink()

    def standby(self, primary_conninfo: str | None = None) -> ThrowawayPostgres:
        """A streaming standby of this server, started: a base backup (pg_basebackup) in a
        folder and on a port of its own, following `primary_conninfo` (by default this
        server's socket; a test may route it through a proxy). The caller destroys it (or
        uses it as a context manager); promote() makes it a primary."""
        replica = ThrowawayPostgres(
            durable=self.durable, max_connections=self.max_connections, superuser=self.superuser
        )
        replica.password = self.password  # the backup carries this server's roles
        try:
            self._pg(
                "pg_basebackup", "-D", str(replica.data), "-h", str(self.socket_dir), "-p", str(self.port),
                "-U", self.superuser, "--wal-method=stream", "--checkpoint=fast", "--no-sync",
            )  # fmt: skip
            with (replica.data / "postgresql.conf").open("a") as conf:
                conf.write(f"\n# standby\nport = {replica.port}\n")
                conf.write(f"unix_socket_directories = '{replica.socket_dir}'\n")
            following = primary_conninfo or (
                f"host={self.socket_dir} port={self.port} user={self.superuser} application_name=standby"
            )
            with (replica.data / "postgresql.auto.conf").open("a") as auto:  # read last: it wins
                auto.write("primary_conninfo = '{}'\n".format(following.replace("'", "''")))
            (replica.data / "standby.signal").touch()
            if replica._run_as:
                user = pwd.getpwnam(SERVER_USER)
                for name in ("postgresql.conf", "postgresql.auto.conf", "standby.signal"):
                    os.chown(replica.data / name, user.pw_uid, user.pw_gid)
            replica.start()
        except BaseException:
            replica.destroy()
            raise
        return replica

    def promote(self) -> None:
        """End a standby's recovery: it becomes a primary on a new timeline."""
        result = self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote", check=False)
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not promote: {result.stderr}\n{self.log_tail()}")

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- connection strings -----------------------------------------------------------
    def dsn(
        self, dbname: str = "postgres", *, password: str | None = None, host: str = "127.0.0.1"
    ) -> str:
        secret = self.password if password is None else password
        return (
            f"postgresql://{quote(self.superuser)}:{quote(secret, safe='')}"
            f"@{host}:{self.port}/{quote(dbname)}"
        )

    def socket_conninfo(self, dbname: str = "postgres") -> str:
        """The superuser through the Unix socket (trusted, no TLS): for administration."""
        return f"host={self.socket_dir} port={self.port} user={self.superuser} dbname={dbname}"

    def create_database(self, name: str) -> str:
        """Create an empty database and return a DSN for it."""
        import psycopg

        with psycopg.connect(self.socket_conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
