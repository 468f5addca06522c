"""`guardedcron operator`: run the kopf operator (what the chart's Deployment starts).

Settings come from the environment the chart sets (see docs/design.md, "Operator
settings"); the flags of the same meaning win over it. Bad settings: exit 64 with one
line per problem, naming the variable or flag.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guardedcron.contract import EXIT_OK, EXIT_USAGE
from guardedcron.spec import OperatorSettings, Problem, SettingsError, settings_from_env

ENV_NAMESPACES = "GUARDEDCRON_NAMESPACES"
ENV_PEERING = "GUARDEDCRON_PEERING"
ENV_PRIORITY = "GUARDEDCRON_PRIORITY"
ENV_POD_IP = "GUARDEDCRON_POD_IP"
ENV_METRICS_PORT = "GUARDEDCRON_METRICS_PORT"
ENV_LOG_LEVEL = "GUARDEDCRON_LOG_LEVEL"
ENV_STOP_WORKLOAD = "GUARDEDCRON_STOP_WORKLOAD"
ENV_OUTCOME_RECORDING = "GUARDEDCRON_OUTCOME_RECORDING"
BOOLEANS: Mapping[str, bool] = {"true": True, "false": False, "": False}

PRIORITY_FROM_POD_IP = "pod-ip"
DEFAULT_METRICS_PORT = 9090
LOG_LEVELS: Mapping[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
}
_IPV6_PRIORITY_BITS = 31


@dataclass(frozen=True)
class RunOptions:
    """How the operator runs, as opposed to what it builds (`OperatorSettings`)."""

    namespaces: tuple[str, ...]  # exact names; empty: the whole cluster
    peering: str | None  # kopf peering object; None: standalone
    priority: int
    metrics_port: int  # 0: no metrics endpoint
    log_level: str
    liveness: str | None  # kopf's health endpoint URL
    # Allowed to delete pods for spec.lease.onLost: StopWorkload (the chart grants it).
    stop_workload: bool = False
    # Reads DSN Secrets to record finished runs in the database (the chart grants it).
    outcome_recording: bool = False


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog=f"Flags win over the environment: ${ENV_NAMESPACES}, ${ENV_PEERING}, "
               f"${ENV_PRIORITY} (with ${ENV_POD_IP}), ${ENV_METRICS_PORT}, ${ENV_LOG_LEVEL}; "
               f"${ENV_STOP_WORKLOAD} and ${ENV_OUTCOME_RECORDING} (true/false) from the environment only; "
               "builder settings (GUARDEDCRON_GUARD_IMAGE, ...) come from the environment only.")
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NAME",
                        help="watch only this namespace (repeatable); default: all namespaces")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME",
                         help="kopf peering object shared with the other replicas")
    peering.add_argument("--standalone", action="store_true", help="run without peering")
    parser.add_argument("--priority", metavar="N|pod-ip",
                        help="peering priority: an integer, or pod-ip (from $GUARDEDCRON_POD_IP)")
    parser.add_argument("--metrics-port", type=str, metavar="PORT", help="Prometheus /metrics port; 0: off")
    parser.add_argument("--log-level", choices=sorted(LOG_LEVELS, key=LOG_LEVELS.__getitem__))
    parser.add_argument("--liveness", metavar="URL",
                        help="health endpoint for probes, e.g. http://0.0.0.0:8080/healthz")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    problems: list[Problem] = []
    try:
        options = options_from(os.environ, args)
    except SettingsError as error:
        problems.extend(error.problems)
    try:
        settings = settings_from_env(os.environ)
    except SettingsError as error:
        problems.extend(error.problems)
    if problems:
        for problem in problems:
            print(f"guardedcron operator: {problem}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(options.log_level)
    asyncio.run(run_operator(options, settings))
    return EXIT_OK


def options_from(env: Mapping[str, str], args: argparse.Namespace | None = None) -> RunOptions:
    """The run options from the environment, overridden by flags; every bad value is a
    problem naming where it came from."""
    problems: list[Problem] = []

    def pick(flag: str, variable: str) -> tuple[str, str]:
        value = getattr(args, flag, None) if args is not None else None
        if value is not None:
            return str(value), "--" + flag.replace("_", "-")
        return env.get(variable, "").strip(), variable

    flag_namespaces = getattr(args, "namespaces", None) if args is not None else None
    if flag_namespaces:
        names, source = [n.strip() for n in flag_namespaces], "--namespace"
    else:
        names, source = [n.strip() for n in env.get(ENV_NAMESPACES, "").split(",")], ENV_NAMESPACES
    namespaces = tuple(dict.fromkeys(n for n in names if n))
    for bad in (n for n in namespaces if not _is_dns_label(n)):
        problems.append(Problem(source, f"{bad!r} is not a namespace name"))

    if args is not None and getattr(args, "standalone", False):
        peering: str | None = None
    else:
        value, _ = pick("peering", ENV_PEERING)
        peering = value or None

    priority_text, priority_source = pick("priority", ENV_PRIORITY)
    priority = 0
    if priority_text == PRIORITY_FROM_POD_IP:
        pod_ip = env.get(ENV_POD_IP, "").strip()
        try:
            priority = priority_from_ip(pod_ip)
        except ValueError:
            problems.append(Problem(ENV_POD_IP, f"{pod_ip!r} is not an IP address "
                                                f"({priority_source} is {PRIORITY_FROM_POD_IP})"))
    elif priority_text:
        try:
            priority = int(priority_text)
        except ValueError:
            problems.append(Problem(priority_source,
                                    f"must be an integer or {PRIORITY_FROM_POD_IP}, not {priority_text!r}"))

    port_text, port_source = pick("metrics_port", ENV_METRICS_PORT)
    port = DEFAULT_METRICS_PORT
    if port_text:
        port = int(port_text) if port_text.isdigit() else -1
        if not 0 <= port <= 65535:
            problems.append(Problem(port_source,
                                    f"must be a port number 0-65535 (0: off), not {port_text!r}"))

    level, level_source = pick("log_level", ENV_LOG_LEVEL)
    level = level.lower() or "info"
    if level not in LOG_LEVELS:
        problems.append(Problem(level_source, f"must be one of {', '.join(LOG_LEVELS)}, not {level!r}"))

    switches: dict[str, bool] = {}
    for variable in (ENV_STOP_WORKLOAD, ENV_OUTCOME_RECORDING):
        text = env.get(variable, "").strip().lower()
        if text not in BOOLEANS:
            problems.append(Problem(variable, f"must be true or false, not {text!r}"))
        switches[variable] = BOOLEANS.get(text, False)

    if problems:
        raise SettingsError(problems)
    liveness = getattr(args, "liveness", None) if args is not None else None
    return RunOptions(namespaces=namespaces, peering=peering, priority=priority,
                      metrics_port=port, log_level=level, liveness=liveness,
                      stop_workload=switches[ENV_STOP_WORKLOAD],
                      outcome_recording=switches[ENV_OUTCOME_RECORDING])


def priority_from_ip(text: str) -> int:
    """A peering priority unique per pod: the IPv4 address as an integer, or the low 31
    bits of an IPv6 one. kopf pauses every operator of equal priority, so they must differ."""
    address = ipaddress.ip_address(text)
    value = int(address)
    return value if address.version == 4 else value & ((1 << _IPV6_PRIORITY_BITS) - 1)


def configure_logging(level: str) -> None:
    import kopf

    kopf.configure(debug=level == "debug", quiet=level in ("warning", "error"))
    logging.getLogger().setLevel(LOG_LEVELS[level])


async def run_operator(options: RunOptions, settings: OperatorSettings, *,
                       stop_flag: asyncio.Event | None = None,
                       ready_flag: asyncio.Event | None = None) -> None:
    """Run kopf with guardedcron's handlers until stopped (SIGTERM, or `stop_flag`)."""
    import kopf

    from guardedcron.handlers.context import OperatorContext
    from guardedcron.handlers.registry import build_registry
    from guardedcron.kube import KubeClient
    from guardedcron.observability.metrics import start_metrics_server

    context = OperatorContext(client=KubeClient(), settings=settings, namespaces=options.namespaces,
                              stop_workload=options.stop_workload,
                              outcome_recording=options.outcome_recording)
    server = (await start_metrics_server(options.metrics_port, context.metrics.registry)
              if options.metrics_port else None)
    try:
        await kopf.operator(
            registry=build_registry(context),
            clusterwide=not options.namespaces,
            namespaces=options.namespaces,
            standalone=options.peering is None,
            peering_name=options.peering,
            priority=options.priority,
            liveness_endpoint=options.liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if server is not None:
            await server.stop()


def _is_dns_label(name: str) -> bool:
    return 0 < len(name) <= 63 and name.replace("-", "a").isalnum() and name.islower() \
        and name[0].isalnum() and name[-1].isalnum()
