"""What the official `kubernetes` client costs the operator's process at import.

    .venv/bin/python -m bench.operator_imports [--rounds 3]

Each round starts fresh interpreters that import the operator's modules
(`guardedcron.handlers.registry`, `guardedcron.cli.operator`), once with the client
hidden the way `guardedcron operator` hides it (guardedcron.cli.lean_operator) and once
without hiding (kopf then imports `kubernetes.client` at its own import), and the client
alone (`kubernetes.config`, `kubernetes.aio.client`). Printed: wall time of the imports
and the process's peak resident memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PROBE = """
import resource, sys, time
if {hide}:
    from guardedcron.cli.lean_operator import hide_official_client
    hide_official_client()
started = time.perf_counter()
{imports}
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(round((time.perf_counter() - started) * 1000), peak_mib, "kubernetes" in sys.modules)
"""

CASES = {
    "operator, client hidden (as `guardedcron operator`)":
        (True, "import guardedcron.handlers.registry, guardedcron.cli.operator"),
    "operator, client importable (kopf imports it)":
        (False, "import guardedcron.handlers.registry, guardedcron.cli.operator"),
    "kubernetes.config alone": (False, "import kubernetes.config"),
    "kubernetes.aio.client alone": (False, "import kubernetes.aio.client"),
    "empty interpreter": (False, "pass"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'case':55} {'import ms':>18} {'peak RSS MiB':>14}  client loaded")
    for name, (hide, imports) in CASES.items():
        times, memory, loaded = [], [], set()
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, "-c", PROBE.format(hide=hide, imports=imports)],
                                 capture_output=True, text=True, check=True, timeout=120).stdout.split()
            times.append(int(out[0]))
            memory.append(int(out[1]))
            loaded.add(out[2])
        print(f"{name:55} {min(times):>8}-{max(times):<9} {min(memory):>5}-{max(memory):<8}  "
              f"{'/'.join(sorted(loaded))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
