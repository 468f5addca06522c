"""What every benchmark shares: one durable local PostgreSQL, statistics, and Markdown tables.

The server is the same throwaway server the tests use, but durable (fsync and full-page
writes on, synchronous commit), so WAL figures and commit latency are those of a real
installation on this machine's disk, and it preloads pg_stat_statements so the
benchmarks can count the statements each approach sends.
"""

from __future__ import annotations

import compileall
import io
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from guardedcron.guard.migrations import migrate
from guardedcron_devenv.postgres import ThrowawayPostgres

Connection = psycopg.Connection[tuple[Any, ...]]

REPO = Path(__file__).resolve().parent.parent
# The cold start's default "before": the last commit, so a run shows what the working tree changes.
BEFORE_COMMIT = "HEAD"


@dataclass(frozen=True)
class Tree:
    """One version of guardedcron's code: its operator/ folder, run by this venv's Python."""

    label: str
    operator: Path

    def env(self, dsn: str | None = None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(self.operator)}
        if dsn is not None:
            env["GUARDEDCRON_DSN"] = dsn
        return env


@contextmanager
def trees(before: str = BEFORE_COMMIT) -> Iterator[tuple[Tree, Tree]]:
    """(before, after): `before`'s operator/ from git, and the working tree's.

    Both have their bytecode compiled first, as the image has (the Dockerfile's pip install
    compiles it), so that neither pays for compiling its modules on every run.
    """
    with tempfile.TemporaryDirectory(prefix="guardedcron-before-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", before, "operator"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        old, new = Tree(f"before ({before})", Path(tmp) / "operator"), Tree("after", REPO / "operator")
        for tree in (old, new):
            compileall.compile_dir(tree.operator, quiet=1)
        yield old, new


def migrated_database(server: ThrowawayPostgres, name: str, tree: Tree) -> str:
    """A fresh database migrated by `tree`'s own `guardedcron db migrate` (its schema version)."""
    dsn = server.create_database(name)
    subprocess.run(
        [sys.executable, "-m", "guardedcron", "db", "migrate"],
        env=tree.env(dsn),
        capture_output=True,
        check=True,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return dsn


def durable_server() -> ThrowawayPostgres:
    return ThrowawayPostgres(
        durable=True,
        settings=[("shared_preload_libraries", "'pg_stat_statements'"), ("pg_stat_statements.track", "all")],
    )


def fresh_database(server: ThrowawayPostgres, name: str) -> str:
    dsn = server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return dsn


def connect(dsn: str, name: str = "bench") -> Connection:
    return psycopg.connect(dsn, autocommit=True, application_name=name)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: the value below which `fraction` of the samples fall."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def machine_line(server: ThrowawayPostgres | None = None) -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):  # noqa: SIM115 - read once, at start
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    version = "PostgreSQL ?"
    if server is not None:
        out = subprocess.run([str(server.bin / "postgres"), "--version"], capture_output=True, text=True)
        version = out.stdout.strip().replace("postgres (PostgreSQL)", "PostgreSQL")
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, {version}, "
        f"load average at start {os.getloadavg()[0]:.1f}"
    )


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += self.notes
        return "\n".join(lines) + "\n"


def statements_since_reset(conn: Connection, dbname: str) -> dict[str, tuple[int, float]]:
    """Per statement text since the last pg_stat_statements_reset(): (calls, total execution ms)."""
    rows = conn.execute(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
        " WHERE d.datname = %s AND s.toplevel AND query NOT ILIKE '%%pg_stat_statements%%'",
        (dbname,),
    ).fetchall()
    return {str(q): (int(c), float(t)) for q, c, t in rows}


def wal_lsn(conn: Connection) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set size of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
