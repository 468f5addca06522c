"""Time-zone names, checked the way the Kubernetes API server checks CronJob.timeZone."""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from guardedcron.schedule.errors import ScheduleError

# The API server's rule for each '/'-separated part of the name (IANA naming, plus the
# digits and '+' of legacy names such as Etc/GMT+5).
_NAME_PART = re.compile(r"[A-Za-z.\-_0-9+]{1,14}")


def load_time_zone(name: str) -> ZoneInfo:
    """The zone for an IANA name such as "Europe/Stockholm"; ScheduleError if unknown.

    The data comes from the system's zoneinfo or, where that is missing (slim images),
    from the `tzdata` package, which is a dependency for that reason.
    """
    if not name:
        raise ScheduleError("time zone name is empty: omit timeZone to use UTC", token=name)
    if name.lower() == "local":
        raise ScheduleError(
            f"time zone {name!r} is refused (it would mean the controller's own zone): "
            "give an IANA name such as 'Europe/Stockholm'",
            token=name,
        )
    parts = name.split("/")
    if any(part in (".", "..") or part.startswith("-") or not _NAME_PART.fullmatch(part)
           for part in parts):
        raise ScheduleError(
            f"time zone {name!r} is not a valid IANA name (letters, digits, '.', '-', '_', '+', "
            "at most 14 characters between slashes)",
            token=name,
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder such as "Europe"
        raise ScheduleError(
            f"unknown time zone {name!r}: not in the IANA time-zone database", token=name,
        ) from None
