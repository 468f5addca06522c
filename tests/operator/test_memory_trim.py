"""The operator gives freed memory back: glibc's allocator (the chart's environment) keeps
freed blocks resident until `malloc_trim` is called, and `guardedcron operator` calls it
(guardedcron.cli.operator_memory; the figures are in docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from guardedcron.cli import operator_memory
from guardedcron.cli.operator_memory import ALLOCATOR_ENV

GUARDEDCRON = str(Path(sys.executable).parent / "guardedcron")
# A bound on the wait for the operator's first trim (5 s after it starts), not a timing.
START_SECONDS = 60.0
# 300,000 blocks of 300 bytes (about 100 MiB under glibc) and one in 64 kept, as the
# long-lived records made during the start-up peak keep the memory around them.
FRAGMENT = """
import asyncio, json
from guardedcron.cli.operator_memory import malloc_trim, resident_mib, trim_once
baseline = resident_mib()
blocks = [bytes(300) for _ in range(300_000)]
kept = blocks[::64]
del blocks
after_free = resident_mib()
before, after = asyncio.run(trim_once(malloc_trim()))
print(json.dumps({"freed_but_resident": after_free - baseline, "released": before - after}))
"""


def test_freed_memory_stays_resident_until_the_trim_gives_it_back() -> None:
    result = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True,
                            timeout=120, check=True, env={**os.environ, **ALLOCATOR_ENV})
    figures = json.loads(result.stdout)
    assert figures["freed_but_resident"] > 60, figures  # free() alone returned almost nothing
    assert figures["released"] > 60, figures


async def test_the_operator_trims_its_memory(kubeconfig: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        GUARDEDCRON, "operator", "--standalone", "--metrics-port", "0", "--log-level", "debug",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **ALLOCATOR_ENV, "KUBECONFIG": str(kubeconfig)})
    assert process.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(START_SECONDS):
            while not any("malloc_trim: resident" in line for line in seen):
                line = (await process.stderr.readline()).decode(errors="replace")
                assert line, "".join(seen[-20:])  # the operator ended before its first trim
                seen.append(line)
    finally:
        process.kill()
        await process.wait()



def test_no_collection_while_the_memory_moves() -> None:
    """A collection walks every live object, and while a start-up grows or falls it still
    holds most of them: a trim then skips it (but not for longer than an idle period);
    once the memory stops moving, the trim collects first."""
    wants = operator_memory.wants_collection
    moved = operator_memory.STEADY_MIB
    assert not wants(100 + moved, 100, since_collection=5, idle_seconds=60)  # growing
    assert not wants(100 - moved, 100, since_collection=5, idle_seconds=60)  # falling
    assert wants(100 + moved, 100, since_collection=60, idle_seconds=60)
    assert wants(100.5, 100, since_collection=5, idle_seconds=60)  # steady
