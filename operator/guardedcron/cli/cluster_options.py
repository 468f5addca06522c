"""What chooses a GuardedCronJob in a cluster, for the commands that read or change one
(trigger, backfill, the kubectl gcj commands): the kubectl-style options and the check of the
name and namespace, made before any request."""

from __future__ import annotations

import argparse
import sys

from guardedcron import contract
from guardedcron.objects import is_dns_label, is_dns_subdomain


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """-n, --kubeconfig and --context, as kubectl spells them."""
    parser.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace, else default")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG, "
                        "else ~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")


def name_problems(name: str | None, namespace: str | None) -> list[str]:
    """Why NAME (a GuardedCronJob's name, by the rule its admission applies) or the
    namespace cannot name an object; empty when both can (or are not given)."""
    problems = []
    if name is not None and not is_dns_subdomain(name, contract.CRONJOB_NAME_MAX):
        problems.append(f"NAME {name[:80]!r} is not a valid name (a GuardedCronJob's name is "
                        "lower-case letters, digits, '-' and '.', starting and ending with a "
                        f"letter or digit, at most {contract.CRONJOB_NAME_MAX} characters)")
    if namespace is not None and not is_dns_label(namespace, contract.NAMESPACE_MAX):
        problems.append(f"--namespace {namespace[:80]!r} is not a valid name (lower-case letters, "
                        "digits and '-', starting and ending with a letter or digit, at most "
                        f"{contract.NAMESPACE_MAX} characters)")
    return problems


def reported_name_problems(prog: str, name: str | None, namespace: str | None) -> bool:
    """Print each of name_problems as `prog: problem` on stderr; True when there was one
    (the command then exits 64 with nothing changed)."""
    problems = name_problems(name, namespace)
    for problem in problems:
        print(f"{prog}: {problem}", file=sys.stderr)
    return bool(problems)
