"""Many contenders for one lock at the same instant: how fast does every loser hear "no"?

- 100 connections from one process (threads), released together by one event: one must
  win, and the last loser's answer is the figure (target: within 1 s; the seeds allow 5 s).
- 20 separate `guardedcron acquire` processes started together, as 20 replicas or
  clusters would: the time until the last one exits, and the CPU each guard run costs
  (process start-up dominates on 2 cores, so the CPU figure is the one that scales).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

from tests.support import GUARDEDCRON

from bench.common import Table, connect, median, ms, percentile
from guardedcron.guard import lease as lease_ops
from guardedcron.guard.lease import AcquireRequest


def connection_round(dsn: str, lock: str, contenders: int) -> tuple[int, list[float]]:
    """Returns (winners, seconds from the start signal to each answer)."""
    conns = [connect(dsn, f"c{i}") for i in range(contenders)]
    go = threading.Event()
    answers: list[float] = [0.0] * contenders
    won = [False] * contenders
    started = [0.0]

    def contend(i: int) -> None:
        go.wait()
        result = lease_ops.acquire(conns[i], AcquireRequest(lock, f"c{i}", 60))
        answers[i] = time.perf_counter() - started[0]
        won[i] = result.acquired

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    started[0] = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    for conn in conns:
        conn.close()
    return sum(won), answers


def process_round(dsn: str, lock: str, contenders: int) -> tuple[list[int], list[float], list[float]]:
    """Returns (exit codes, seconds from the first spawn to each exit, CPU seconds of each run)."""
    env = {**os.environ, "GUARDEDCRON_DSN": dsn}
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [GUARDEDCRON, "acquire", "--lock", lock, "--holder", f"p{i}", "--lease-seconds", "60"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(contenders)
    ]
    pending = {p.pid: i for i, p in enumerate(procs)}
    codes = [0] * contenders
    exits = [0.0] * contenders
    cpu = [0.0] * contenders
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in pending:
            continue
        i = pending.pop(pid)
        exits[i] = time.perf_counter() - started
        codes[i] = os.waitstatus_to_exitcode(status)
        cpu[i] = usage.ru_utime + usage.ru_stime
    for i, p in enumerate(procs):
        p.returncode = codes[i]  # reaped by wait4 above; tell Popen so
    return codes, exits, cpu


def run(dsn: str, *, rounds: int = 10, connections: int = 100, processes: int = 20) -> list[Table]:
    conn_table = Table(
        f"Contention: {connections} connections from one process, {rounds} rounds",
        ["round", "winners", "median answer ms", "last loser answered ms"],
    )
    lasts = []
    for r in range(rounds):
        winners, answers = connection_round(dsn, f"crowd-{r}", connections)
        lasts.append(max(answers))
        conn_table.add(r + 1, winners, ms(median(answers)), ms(max(answers)))
    conn_table.notes.append(
        f"Last loser answered: median {ms(median(lasts))} ms, worst {ms(max(lasts))} ms (target ≤ 1000 ms)."
        " Time is counted from the moment all threads are released; Python threads take turns under the"
        " GIL, so part of it is the client's own scheduling."
    )
    proc_table = Table(
        f"Contention: {processes} `guardedcron acquire` processes started together, {rounds // 2} rounds",
        ["round", "exit codes", "first exit ms", "last exit ms", "median CPU per guard run ms"],
    )
    proc_lasts, cpus = [], []
    for r in range(rounds // 2):
        codes, exits, cpu = process_round(dsn, f"replicas-{r}", processes)
        proc_lasts.append(max(exits))
        cpus += cpu
        summary = f"{codes.count(0)} won (0), {codes.count(75)} lost (75)" + (
            f", other {sorted(c for c in codes if c not in (0, 75))}" if set(codes) - {0, 75} else ""
        )
        proc_table.add(r + 1, summary, ms(min(exits)), ms(max(exits)), ms(median(cpu)))
    proc_table.notes.append(
        f"Last exit: median {ms(median(proc_lasts))} ms, worst {ms(max(proc_lasts))} ms (seeds: ≤ 5000 ms)."
        f" CPU per guard run: median {ms(median(cpus))} ms, p99 {ms(percentile(cpus, 0.99))} ms"
        f" (user + system of each process, from wait4); {processes} runs need about"
        f" {median(cpus) * processes:.1f} CPU-seconds, i.e. at least {median(cpus) * processes / 2:.1f} s"
        " on 2 cores."
    )
    return [conn_table, proc_table]
