"""`guardedcron render -f FILE`: print the CronJob the operator would create.

For GitOps diffs and debugging: it reads GuardedCronJob manifests, fills in the CRD's
schema defaults (from the CRD file itself), runs the operator's own checks and builder,
and prints the CronJobs as YAML. Any invalid input: exit 64, every reason on stderr,
nothing on stdout.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import guardedcron
from guardedcron import contract
from guardedcron.builders import build_cronjob
from guardedcron.spec import (
    OperatorSettings,
    SettingsError,
    SpecError,
    apply_schema_defaults,
    parse_guarded_cronjob,
    settings_from_env,
)
from guardedcron.spec.defaults import schema_for
from guardedcron.spec.parse import API_VERSION
from guardedcron.spec.settings import ENV_CLUSTER_NAME, ENV_GUARD_IMAGE

ENV_CRD = "GUARDEDCRON_CRD"
CRD_FILE_NAME = f"{contract.PLURAL}.{contract.API_GROUP}.yaml"
STDIN = "-"

EPILOG = f"""\
Documents of other kinds in the input are passed over, so `kustomize build | guardedcron
render -f -` works. A manifest without metadata.uid (not applied yet) renders without
ownerReferences: a made-up uid would make the garbage collector delete the CronJob.
Schema defaults come from the CRD file: --crd, else ${ENV_CRD}, else the copy of
crds/{CRD_FILE_NAME} installed with guardedcron. Operator settings come from the environment, as for the
operator ({ENV_GUARD_IMAGE}, {ENV_CLUSTER_NAME}, ...; see docs/design.md).
"""


class RenderInputError(Exception):
    """Input that cannot be rendered; the message names the file."""


@dataclass(frozen=True)
class Document:
    source: str  # file name, '-' for stdin
    index: int  # 1-based position in its file
    body: Any


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-f", "--filename", dest="files", action="append", required=True,
                        metavar="FILE",
                        help="YAML file with one or more GuardedCronJobs; '-' reads stdin; "
                             "repeat for more files")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace of manifests that name none (default: default)")
    parser.add_argument("--crd", type=Path,
                        help=f"the GuardedCronJob CRD file (default: ${ENV_CRD}, else the "
                             "one installed with guardedcron)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_env(os.environ)
        crd = _load_crd(args.crd)
        documents = list(_read_documents(args.files))
    except SettingsError as exc:
        return _fail([f"setting {p}" for p in exc.problems])
    except RenderInputError as exc:
        return _fail([str(exc)])

    cronjobs, reasons = render_documents(documents, crd, settings, args.namespace)
    if reasons:
        return _fail(reasons)
    if not cronjobs:
        return _fail([f"no {contract.KIND} in {', '.join(args.files)}"])
    sys.stdout.write(yaml.safe_dump_all(cronjobs, sort_keys=True, explicit_start=True,
                                        allow_unicode=True, width=1 << 16))
    return contract.EXIT_OK


def render_documents(documents: list[Document], crd: Mapping[str, Any],
                     settings: OperatorSettings, namespace: str
                     ) -> tuple[list[dict[str, Any]], list[str]]:
    """The CronJobs for the GuardedCronJobs among `documents`, or every reason why not."""
    cronjobs: list[dict[str, Any]] = []
    reasons: list[str] = []
    for doc in documents:
        where = f"{doc.source}, document {doc.index}"
        if not isinstance(doc.body, dict):
            reasons.append(f"{where}: must be a YAML mapping (a Kubernetes object)")
            continue
        if doc.body.get("kind") != contract.KIND:
            continue
        metadata = doc.body.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if name:
            where = f"{where} ({name})"
        try:
            parsed = parse_guarded_cronjob(apply_schema_defaults(doc.body, crd),
                                           default_namespace=namespace)
        except SpecError as exc:
            reasons.extend(f"{where}: {problem}" for problem in exc.problems)
            continue
        cronjobs.append(build_cronjob(parsed, settings))
    return cronjobs, reasons


def _read_documents(files: list[str]) -> Iterator[Document]:
    if files.count(STDIN) > 1:
        raise RenderInputError("'-' (standard input) can be given only once")
    for source in files:
        try:
            text = sys.stdin.read() if source == STDIN else Path(source).read_text("utf-8")
        except OSError as exc:
            raise RenderInputError(f"{source}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise RenderInputError(f"{source}: not UTF-8 text") from None
        try:
            bodies = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise RenderInputError(f"{source}: not valid YAML: {_one_line(exc)}") from None
        for index, body in enumerate(bodies, start=1):
            if body is not None:  # an empty document, e.g. after a trailing '---'
                yield Document(source, index, body)


def _load_crd(explicit: Path | None) -> dict[str, Any]:
    path = explicit or _default_crd_path()
    try:
        crd = yaml.safe_load(path.read_text("utf-8"))
    except OSError as exc:
        hint = "" if explicit else f" (pass --crd or set ${ENV_CRD})"
        raise RenderInputError(f"CRD file {path}: cannot read: {exc.strerror}{hint}") from None
    except yaml.YAMLError as exc:
        raise RenderInputError(f"CRD file {path}: not valid YAML: {_one_line(exc)}") from None
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise RenderInputError(f"CRD file {path}: not a CustomResourceDefinition")
    try:
        if schema_for(crd, API_VERSION) is None:
            raise RenderInputError(f"CRD file {path}: does not serve {API_VERSION}")
    except ValueError as exc:
        raise RenderInputError(f"CRD file {path}: {exc}") from None
    return crd


def _default_crd_path() -> Path:
    from_env = os.environ.get(ENV_CRD)
    if from_env:
        return Path(from_env)
    # The package ships the CRD (guardedcron/crds links to the repository's crds/).
    return Path(str(importlib.resources.files(guardedcron).joinpath("crds", CRD_FILE_NAME)))


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _fail(reasons: list[str]) -> int:
    for reason in reasons:
        sys.stderr.write(f"guardedcron render: {reason}\n")
    return contract.EXIT_USAGE
