"""Run `guardedcron` as its console script does, noting the process's CPU at each phase.

    python bench/guard_phases.py FD acquire --lock ... (the command's own arguments)

Run by bench/cold_start.py in the guard's own interpreter (PYTHONPATH chooses the code);
writes one JSON object to file descriptor FD, then exits as the command would. Phases end
at: this script's first line (interpreter start-up), psycopg's import starting (our
modules, argparse and whatever standard library they pull in first), psycopg's import
done, the connection call starting and returning, and `main()` returning (the call and
the output). The parent adds the exit from the finished process's own accounting.
Also counted: the cyclic garbage collector's passes and the CPU they took.

It changes nothing the command does: it only watches psycopg's import (a finder that
steps aside after one use) and wraps `psycopg.connect` to read the clock around it.
"""

from __future__ import annotations

# Only modules the interpreter has loaded already (or tiny ones) before the first mark: what
# this script imports early would be charged to start-up instead of the command.
import gc
import os
import resource
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


marks: dict[str, float] = {"interpreter start-up": cpu()}
collections = {"passes": 0, "cpu": 0.0, "started": 0.0}


def count_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        collections["started"] = cpu()
    else:
        collections["passes"] += 1
        collections["cpu"] += cpu() - collections["started"]


class WatchPsycopg:
    """A meta path finder that only notices psycopg's import starting and ending."""

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name != "psycopg":
            return None
        sys.meta_path.remove(self)
        marks["guardedcron modules, argparse, stdlib"] = cpu()
        from importlib.util import find_spec

        spec = find_spec(name)
        assert spec is not None and spec.loader is not None
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            marks["psycopg import"] = cpu()
            wrap_connect(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def wrap_connect(psycopg: Any) -> None:
    connect = psycopg.Connection.connect.__func__

    def timed(cls: Any, *args: Any, **kwargs: Any) -> Any:
        marks["until connect"] = cpu()
        conn = connect(cls, *args, **kwargs)
        marks["connect"] = cpu()
        return conn

    psycopg.connect = psycopg.Connection.connect = classmethod(timed).__get__(None, psycopg.Connection)


def main() -> None:
    out = int(sys.argv.pop(1))
    sys.argv[0] = "guardedcron"
    gc.callbacks.append(count_collection)
    sys.meta_path.insert(0, WatchPsycopg())  # type: ignore[arg-type]
    from guardedcron.cli.main import main as guardedcron

    code = guardedcron()
    marks["call and output"] = cpu()
    gc.callbacks.remove(count_collection)
    import json

    report = {"marks": marks, "gc_passes": collections["passes"], "gc_cpu": collections["cpu"]}
    os.write(out, json.dumps(report).encode())
    os.close(out)
    sys.exit(code)


if __name__ == "__main__":
    main()
