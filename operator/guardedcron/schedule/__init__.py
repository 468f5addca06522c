"""Cron schedules with the Kubernetes CronJob controller's semantics (pure, no I/O).

`Schedule.parse` accepts what the API server accepts for CronJob.spec.schedule (minus
the refusals explained in `expression`), and the search methods return the instants the
controller would schedule, daylight-saving changes included (see `search`).
"""

from guardedcron.schedule.errors import ScheduleError
from guardedcron.schedule.expression import MACROS, Schedule
from guardedcron.schedule.zones import load_time_zone

__all__ = ["MACROS", "Schedule", "ScheduleError", "load_time_zone"]
