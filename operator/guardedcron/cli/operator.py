"""`guardedcron operator`: run the kopf operator (what the chart's Deployment starts).

Settings come from the environment the chart sets (see docs/design.md, "Operator
settings"); the flags of the same meaning win over it. Bad settings: exit 64 with one
line per problem, naming the variable or flag.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any

from guardedcron.cli.lean_operator import hide_official_client
from guardedcron.contract import EXIT_OK, EXIT_USAGE
from guardedcron.observability.logs import DEFAULT_LOG_FORMAT, LOG_FORMATS, configure_logging
from guardedcron.spec import Flags, Settings, SettingsError, read_settings
from guardedcron.spec.settings import (
    ENV_GUARD_IMAGE,
    ENV_LOG_LEVEL,
    ENV_METRICS_PORT,
    ENV_NAMESPACES,
    ENV_OUTCOME_RECORDING,
    ENV_PEERING,
    ENV_POD_IP,
    ENV_PRIORITY,
    ENV_STOP_WORKLOAD,
    LOG_LEVELS,
    PRIORITY_FROM_POD_IP,
)


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog=f"Flags win over the environment: ${ENV_NAMESPACES}, ${ENV_PEERING}, "
               f"${ENV_PRIORITY} (with ${ENV_POD_IP}), ${ENV_METRICS_PORT}, ${ENV_LOG_LEVEL}; "
               f"${ENV_STOP_WORKLOAD} and ${ENV_OUTCOME_RECORDING} (true/false) from the environment only; "
               f"builder settings ({ENV_GUARD_IMAGE}, ...) come from the environment only.")
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NAME",
                        help="watch only this namespace (repeatable); default: all namespaces")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME",
                         help="kopf peering object shared with the other replicas")
    peering.add_argument("--standalone", action="store_true", help="run without peering")
    parser.add_argument("--priority", metavar=f"N|{PRIORITY_FROM_POD_IP}",
                        help=f"peering priority: an integer, or {PRIORITY_FROM_POD_IP} (from ${ENV_POD_IP})")
    parser.add_argument("--metrics-port", type=str, metavar="PORT", help="Prometheus /metrics port; 0: off")
    parser.add_argument("--log-level", choices=sorted(LOG_LEVELS, key=LOG_LEVELS.__getitem__))
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=DEFAULT_LOG_FORMAT,
                        help="text (kopf's lines, the default) or json (one object per line, with "
                             "the kind, namespace and name of the object a line is about)")
    parser.add_argument("--liveness", metavar="URL",
                        help="health endpoint for probes, e.g. http://0.0.0.0:8080/healthz")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(os.environ, args)
    except SettingsError as error:
        for problem in error.problems:
            print(f"guardedcron operator: {problem}", file=sys.stderr)
        return EXIT_USAGE
    hide_official_client()  # before kopf's first import (configure_logging's)
    configure_logging(settings.log_level, args.log_format)
    asyncio.run(run_operator(settings))
    return EXIT_OK


def settings_from(env: Mapping[str, str], args: argparse.Namespace | None = None) -> Settings:
    """Every setting, from the environment and this command's flags (which win): the
    one place the operator's settings are built."""
    if args is None:
        return read_settings(env)
    return read_settings(env, Flags(
        namespaces=tuple(args.namespaces or ()), peering=args.peering, standalone=args.standalone,
        priority=args.priority, metrics_port=args.metrics_port, log_level=args.log_level,
        liveness=args.liveness))


async def run_operator(settings: Settings, *, stop_flag: asyncio.Event | None = None,
                       ready_flag: asyncio.Event | None = None) -> None:
    """Run kopf with guardedcron's handlers until stopped (SIGTERM, or `stop_flag`)."""
    import kopf

    from guardedcron.cli.operator_memory import (
        allocator_trim,
        log_allocator,
        own_full_collections,
        trim_periodically,
    )
    from guardedcron.handlers import kopf_startup
    from guardedcron.handlers.context import OperatorContext
    from guardedcron.handlers.registry import build_registry
    from guardedcron.kube import KubeClient
    from guardedcron.observability.metrics import start_metrics_server

    context = OperatorContext(client=KubeClient(), settings=settings)
    server = (await start_metrics_server(settings.metrics_port, context.metrics.registry)
              if settings.metrics_port else None)
    kopf_startup.install()  # slimmed watch events, no body kept without a running timer
    trim = allocator_trim()  # give the start-up peak back to the system (operator_memory)
    log_allocator(trim)
    trimming = asyncio.create_task(trim_periodically(trim))
    try:
        with own_full_collections():  # the trims' collections are the only full ones
            await kopf.operator(
                registry=build_registry(context),
                clusterwide=not settings.namespaces,
                namespaces=settings.namespaces,
                standalone=settings.peering is None,
                peering_name=settings.peering,
                priority=settings.priority,
                liveness_endpoint=settings.liveness,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
    finally:
        trimming.cancel()
        if server is not None:
            await server.stop()
