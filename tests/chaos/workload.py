"""A guarded job as a real process: `guardedcron acquire`, fenced work, `guardedcron release`.

    GUARDEDCRON_DSN=... python -m tests.chaos.workload --lock L --holder H --slot S \\
        --lease-seconds 2 --run-dir DIR [--seed N] [--pooled]

It runs the real `guardedcron acquire` command (a separate process, as the injected init
container does), and only when that wins does it import the database driver, read the
fence from the file the guard wrote, and do the job (tests/chaos/work.py). At the end
it releases through the CLI's own entry point, in this process (saving one interpreter
start per run on a 2-core machine; the acquire is the contended call, so that one is
a real process).

Exit codes: acquire's own code when it did not win (75, 69, ...), 0 after the work and
the release, 76 when a fenced write was refused, 1 on anything else.
Left in DIR for the harness: `answer.json` (acquire's exit code, its JSON line, how long
it took), the guard's `fence` and `lease.json` when it won, and `progress` (batches
committed so far: the fault injector waits on it to strike mid-run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

GUARDEDCRON = str(Path(sys.executable).with_name("guardedcron"))
EXIT_REFUSED = 76
RELEASE_TRIES = 20


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def acquire(args: argparse.Namespace) -> int:
    started = time.monotonic()
    command = [
        GUARDEDCRON,
        "acquire",
        "--lock",
        args.lock,
        "--holder",
        args.holder,
        "--lease-seconds",
        str(args.lease_seconds),
        "--out",
        str(args.run_dir),
        "--retain-runs",
        "100000000",
        "--connect-timeout",
        "2",
    ]
    if args.slot is not None:
        command += ["--slot", str(args.slot)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    answer = {
        "exit": proc.returncode,
        "answer": json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None,
        "seconds": time.monotonic() - started,
        "stderr": proc.stderr[-2000:],
    }
    write_atomically(args.run_dir / "answer.json", json.dumps(answer))
    return proc.returncode


def work(args: argparse.Namespace) -> int:
    import random

    from guardedcron.cli.main import main as guardedcron
    from guardedcron.guard.fence import read_lease
    from tests.chaos.work import Holding, Job, Refused

    lease = read_lease(args.run_dir)
    holding = Holding(lease.lock, lease.holder, lease.fence, args.lease_seconds)
    progress = args.run_dir / "progress"

    def report_progress(batches: int) -> None:
        write_atomically(progress, f"{batches}\n")

    job = Job(
        os.environ["GUARDEDCRON_DSN"],
        holding,
        rng=random.Random(args.seed),
        before_batch=report_progress,
        pooled=args.pooled,
    )
    try:
        job.run()
    except Refused as exc:
        sys.stderr.write(f"workload {args.holder}: stopped, {exc}\n")
        return EXIT_REFUSED
    finally:
        job.close()
    report_progress(job.batches)
    release = [
        "release", "--lock", args.lock, "--holder", args.holder, "--fence", str(lease.fence),
        "--outcome", "succeeded",
    ]  # fmt: skip
    for _ in range(RELEASE_TRIES):
        try:
            code = guardedcron([*release, "--connect-timeout", "2"])
        except Exception as exc:  # the connection dropped mid-call
            sys.stderr.write(f"workload {args.holder}: release failed: {exc}\n")
            code = 69
        if code != 69:  # 69: the server is restarting; try again, else the lease runs out by itself
            return 0 if code in (0, 75) else code
        time.sleep(0.2)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--slot", type=int)
    parser.add_argument("--lease-seconds", type=float, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pooled", action="store_true", help="GUARDEDCRON_DSN goes through a transaction pooler"
    )
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    code = acquire(args)
    if code != 0:
        return code
    return work(args)


if __name__ == "__main__":
    sys.exit(main())
