"""What a pass works from, what it asks the executor to do, and what it is told back.

The planner (planner/pass_plan.py) yields one action at a time and receives its result;
the executor (handlers/reconcile.py) performs each against the API server, the
operator's memory, the metrics or the database. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from guardedcron.spec import ParsedSpec, Settings
from guardedcron.status import MetricChanges, RunEvent
from guardedcron.status.outcomes import OutcomeRecord

Body = Mapping[str, Any]


@dataclass(frozen=True)
class Observed:
    """The GuardedCronJob and its children as the operator's caches hold them."""

    gcj: Body
    cronjob: Body | None  # None: it does not exist
    jobs: Sequence[Body] = ()
    pods_by_job: Mapping[str, Sequence[Body]] = field(default_factory=dict)


@dataclass(frozen=True)
class PassView:
    """Everything one pass decides from: the objects, the operator's settings, the clock,
    and what the operator remembers of this GuardedCronJob."""

    observed: Observed
    settings: Settings
    now: datetime
    written_status: Mapping[str, Any] | None = None  # the status this process wrote last
    done: frozenset[str] = frozenset()  # once-per-process actions already taken (`Remember`)


@dataclass(frozen=True)
class PassResult:
    applied: bool  # the CronJob was server-side applied
    status_written: bool
    apply_error: str | None  # why the CronJob is not as desired, if it cannot be
    not_owned: bool = False  # a CronJob of the same name belongs to someone else


# --- results ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Done:
    """The request succeeded; `body` is the object the API server returned, if any."""

    body: Body | None = None


@dataclass(frozen=True)
class Refused:
    """The API server said no (`code`), or could not be reached (`code` None). `error` is
    the executor's exception, raised again as it is when the pass must be retried."""

    error: Exception
    code: int | None
    message: str
    namespace_terminating: bool = False

    @property
    def permanent(self) -> bool:
        """Sending the same request again cannot succeed (400, 422)."""
        return self.code in (400, 422)

    @property
    def transient(self) -> bool:
        """No answer, a server error or throttling: the same request may succeed later."""
        return self.code is None or self.code >= 500 or self.code == 429


Result = Done | Refused


# --- actions ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FetchRuns:
    """Read these Jobs of the GuardedCronJob and their pods from the API server (runs
    status has open that the cache lacks). Answered with `FetchedRuns`."""

    namespace: str
    owner: str
    job_names: tuple[str, ...]


@dataclass(frozen=True)
class FetchedRuns:
    jobs: Sequence[Body]
    pods_by_job: Mapping[str, Sequence[Body]]


@dataclass(frozen=True)
class ApplyCronJob:
    body: Body
    reason: str  # why it differs from the live one


@dataclass(frozen=True)
class DeleteCronJob:
    namespace: str
    name: str
    uid: str | None


@dataclass(frozen=True)
class CreateJob:
    namespace: str
    body: Body


@dataclass(frozen=True)
class DeletePod:
    namespace: str
    name: str
    uid: str | None


@dataclass(frozen=True)
class DeleteJob:
    namespace: str
    name: str
    uid: str | None


@dataclass(frozen=True)
class PatchStatus:
    namespace: str
    name: str
    patch: Mapping[str, Any]
    status: Mapping[str, Any]  # the whole status written, to remember


@dataclass(frozen=True)
class Remember:
    """Mark a once-per-process action as taken (`PassView.done` holds the marks)."""

    key: str


@dataclass(frozen=True)
class Forget:
    """Let a once-per-process action that failed for a passing reason be tried again."""

    key: str


@dataclass(frozen=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True)
class CountMakeUpRun:
    """A Job the operator started for a past slot (catch-up, backfill, skipped time)."""

    namespace: str
    name: str
    kind: str


@dataclass(frozen=True)
class RecordSuspension:
    namespace: str
    name: str
    suspended: bool | None  # None: the spec does not use suspendAfterFailures


@dataclass(frozen=True)
class RecordChanges:
    namespace: str
    name: str
    changes: MetricChanges


@dataclass(frozen=True)
class RecordOutcomes:
    """Record finished runs in the database (outcome recording); answered with the
    Events for those that could not be recorded."""

    namespace: str
    parsed: ParsedSpec  # where the database and its TLS files are
    records: tuple[OutcomeRecord, ...]


@dataclass(frozen=True)
class PostEvents:
    events: tuple[RunEvent, ...]


Action = (FetchRuns | ApplyCronJob | DeleteCronJob | CreateJob | DeletePod | DeleteJob
          | PatchStatus | Remember | Forget | Log | CountMakeUpRun | RecordSuspension
          | RecordChanges | RecordOutcomes | PostEvents)
