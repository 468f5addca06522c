"""tests/support/faketime.py: libfaketime's leftovers are removed only once their process is gone."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.faketime import remove_leftovers

GONE = 99_999_999  # above any pid_max: no such process


def test_only_the_leftovers_of_ended_processes_are_removed(tmp_path: Path) -> None:
    names = [f"sem.faketime_sem_{GONE}", f"faketime_shm_{GONE}",
             f"sem.faketime_sem_{os.getpid()}", f"faketime_shm_{os.getpid()}", "PostgreSQL.123"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_leftovers(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
