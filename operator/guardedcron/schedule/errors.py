"""The one error the schedule package raises."""

from __future__ import annotations


class ScheduleError(ValueError):
    """A schedule or time zone that Kubernetes would refuse (or that we refuse on purpose).

    `field` names the cron field at fault ("minute", "day-of-week", ...) or is None when
    the problem is the expression as a whole; `token` is the piece of text at fault.
    """

    def __init__(self, message: str, *, field: str | None = None, token: str | None = None):
        super().__init__(message)
        self.field = field
        self.token = token
