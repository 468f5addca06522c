"""`guardedcron backfill NAME --since T --until T [--token T] [--dry-run]`: run the slots
of a past time range, one at a time, oldest first.

It sets the annotation `guardedcron.io/backfill=<token>:<since>/<until>` on the
GuardedCronJob (the GitOps way is to set it in the manifest), and the operator does the
rest: it starts one Job `<name>-<slot>` at a time, skips slots that ran here, and the
guard skips those that ran in any cluster sharing the database; progress is in
status.backfill (docs/design.md, "Catch-up and backfill"). One backfill per token: the
token defaults to a new random one.

`--dry-run` changes nothing: it reads the GuardedCronJob and prints the slots the range
holds, marking those status already shows a run for.

`--since` may be at most 89 days ago (`status.backfill.oldest_backfill_slot`): the guard
keeps slot claims 90 days (`contract.SLOT_CLAIM_RETAIN_DAYS`, its `--retain-days`), and
a slot whose claim is gone would run again. An older `since` exits 64, with --dry-run too.

Answer: one JSON line on stdout. Exit 0 when the annotation was set (or, with
--dry-run, the slots listed); 1 when the API server refused or the GuardedCronJob is
missing; 64 bad input (nothing changed); 69 the API server could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from datetime import UTC, datetime
from typing import Any

from guardedcron import contract
from guardedcron.cli.cluster_options import add_cluster_options, name_problems
from guardedcron.cli.kubeconfig import KubeconfigError, connection_info
from guardedcron.contract import EXIT_FAILURE, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from guardedcron.kube import GUARDED_CRONJOBS, ApiError, ApiUnreachable, KubeClient, NotFound
from guardedcron.spec import SpecError, parse_guarded_cronjob
from guardedcron.status.backfill import (
    MAX_BACKFILL_SLOTS,
    BackfillRequest,
    BackfillRequestError,
    backfill_slots,
    checked_request,
    token_problem,
)
from guardedcron.status.runs import RunRecord
from guardedcron.status.times import epoch_minute, format_time, parse_time

FIELD_MANAGER = "guardedcron-backfill"


class BackfillFailed(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def add_parser(sub: Any, name: str, help_text: str) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text,
        epilog="Sets the annotation guardedcron.io/backfill=<token>:<since>/<until> on the "
               "GuardedCronJob; the operator runs the slots and shows progress in "
               "status.backfill. Removing the annotation stops it.")
    parser.add_argument("name", metavar="NAME", help="the GuardedCronJob")
    parser.add_argument("--since", required=True, metavar="TIME",
                        help="RFC 3339 time with an offset; slots at or after it. At most "
                             f"{contract.SLOT_CLAIM_RETAIN_DAYS - contract.SLOT_CLAIM_MARGIN_DAYS} days ago: "
                             f"the guard keeps slot claims {contract.SLOT_CLAIM_RETAIN_DAYS} days "
                             "(--retain-days), and an older slot could run twice")
    parser.add_argument("--until", required=True, metavar="TIME",
                        help="RFC 3339 time with an offset, not in the future; slots before it")
    parser.add_argument("--token", help="names this backfill (one backfill per token; default: random)")
    parser.add_argument("--dry-run", action="store_true",
                        help="change nothing: list the slots of the range")
    add_cluster_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    prog = getattr(args, "prog", "guardedcron backfill")
    try:
        request = _request(args, now=datetime.now(UTC))
    except BackfillRequestError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        answer = asyncio.run(backfill(args.name, args.namespace, request, dry_run=args.dry_run,
                                      kubeconfig=args.kubeconfig, context=args.context))
    except BackfillFailed as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return error.code
    print(json.dumps(answer, separators=(",", ":")))
    return EXIT_OK


def _request(args: argparse.Namespace, *, now: datetime) -> BackfillRequest:
    problems = name_problems(args.name, args.namespace)
    if problems:
        raise BackfillRequestError("; ".join(problems))
    token = args.token if args.token is not None else f"bf-{secrets.token_hex(4)}"
    problem = token_problem(token) if token.strip() else "must not be empty"
    if problem is not None or ":" in token:
        raise BackfillRequestError(f"--token {problem or 'must not contain :'}")
    since, until = parse_time(args.since), parse_time(args.until)
    for flag, text, value in (("--since", args.since, since), ("--until", args.until, until)):
        if value is None:
            raise BackfillRequestError(f"{flag} {text[:40]!r} is not an RFC 3339 time with an offset "
                                       "(e.g. 2026-11-30T00:00:00Z)")
    assert since is not None and until is not None
    return checked_request(token, since, until, now=now)


async def backfill(name: str, namespace: str | None, request: BackfillRequest, *, dry_run: bool,
                   kubeconfig: str | None = None, context: str | None = None) -> dict[str, Any]:
    try:
        info = await asyncio.to_thread(connection_info, kubeconfig, context)
    except KubeconfigError as error:
        raise BackfillFailed(str(error), error.code) from None
    namespace = namespace or info.default_namespace or "default"
    client = KubeClient(info)
    try:
        return await _backfill(client, namespace, name, request, dry_run=dry_run)
    except ApiUnreachable as error:
        raise BackfillFailed(f"cannot reach the API server: {error}", EXIT_UNAVAILABLE) from None
    except ApiError as error:
        if error.code == 403:
            raise BackfillFailed(f"not allowed: {error.message} (a backfill needs get and patch on "
                                 "guardedcronjobs in the namespace)") from None
        raise BackfillFailed(f"the API server refused: {error}") from None
    finally:
        await client.close()


async def _backfill(client: KubeClient, namespace: str, name: str, request: BackfillRequest, *,
                    dry_run: bool) -> dict[str, Any]:
    where = f"{namespace}/{name}"
    try:
        gcj = await client.get(GUARDED_CRONJOBS, namespace, name)
    except NotFound:
        raise BackfillFailed(f"GuardedCronJob {where} not found") from None
    try:
        parsed = parse_guarded_cronjob(gcj)
    except SpecError as error:
        raise BackfillFailed(f"GuardedCronJob {where} has an invalid spec: {error}") from None
    slots = backfill_slots(parsed, request.since, request.until)
    if len(slots) > MAX_BACKFILL_SLOTS:
        raise BackfillFailed(f"the range holds more than {MAX_BACKFILL_SLOTS} slots of the schedule "
                             f"{parsed.spec.schedule_text!r}; split it into smaller backfills", EXIT_USAGE)
    answer: dict[str, Any] = {"namespace": namespace, "guarded_cronjob": name, "token": request.token,
                              "annotation": request.annotation(), "slots": len(slots)}
    if dry_run:
        ran_here = _slots_with_runs(gcj)
        answer["dry_run"] = True
        answer["slot_times"] = [{"slot": format_time(t), "ran_here": epoch_minute(t) in ran_here}
                                for t in slots]
        return answer
    previous = ((gcj.get("status") or {}).get("backfill") or {}).get("token")
    if previous == request.token:
        raise BackfillFailed(f"token {request.token!r} was used already (status.backfill); one backfill "
                             "per token: pass another --token", EXIT_USAGE)
    await client.merge_patch(GUARDED_CRONJOBS, namespace, name, {"metadata": {"annotations": {
        contract.ANNOTATION_BACKFILL: request.annotation()}}}, field_manager=FIELD_MANAGER)
    return answer


def _slots_with_runs(gcj: dict[str, Any]) -> set[int]:
    status = gcj.get("status") or {}
    items = [status.get("lastRun"), *(status.get("recentRuns") or ())]
    records = [r for r in (RunRecord.from_status(item) for item in items) if r is not None]
    return {r.slot for r in records if r.slot is not None and not r.manual}
