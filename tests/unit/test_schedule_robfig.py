"""Fire times agree with robfig/cron v3.0.1, the library the CronJob controller runs.

tests/unit/robfig_next/ is a small Go program that asks robfig for fire times; it is
built with the local Go toolchain (which the project needs anyway to build its
kube-apiserver for the e2e suite; `go` fetches robfig through the Go module proxy).
Random schedules are compared in zones whose clocks change at hours other than
midnight, most of them started within a day of a clock change. Zones that change at
midnight or by 30/45 minutes are left out on purpose: there robfig skips runs (and
may loop forever), and we keep the rule instead; see docs/design.md, "Schedules".
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from guardedcron.schedule import Schedule

HARNESS = Path(__file__).parent / "robfig_next"
ZONES = ["UTC", "Europe/Stockholm", "America/New_York", "Europe/London", "Australia/Sydney",
         "Antarctica/Troll", "America/Los_Angeles", "Pacific/Auckland", "Asia/Jerusalem",
         "Australia/Adelaide", "America/Mexico_City"]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
WEEKDAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
FIRE_TIMES = 6


@pytest.fixture(scope="module")
def robfig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    assert go, "the Go toolchain ('go') must be on PATH to build tests/unit/robfig_next"
    binary = tmp_path_factory.mktemp("robfig") / "robfig-next"
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=HARNESS, check=True,
                   capture_output=True, timeout=600)
    return binary


def _value(rng: random.Random, low: int, names: list[str] | None, value: int) -> str:
    return names[value - low] if names and rng.random() < 0.3 else str(value)


def _item(rng: random.Random, low: int, high: int, names: list[str] | None) -> str:
    kind = rng.random()
    if kind < 0.2:
        return rng.choice(["*", "*", "?"])
    if kind < 0.35:
        return f"*/{rng.randint(1, high - low + 2)}"
    if kind < 0.6:
        return _value(rng, low, names, rng.randint(low, high))
    if kind < 0.7:
        return f"{rng.randint(low, high)}/{rng.randint(1, 12)}"
    first = rng.randint(low, high)
    text = f"{_value(rng, low, names, first)}-{_value(rng, low, names, rng.randint(first, high))}"
    return f"{text}/{rng.randint(2, 9)}" if rng.random() < 0.4 else text


def _field(rng: random.Random, low: int, high: int, names: list[str] | None, star: float) -> str:
    if rng.random() < star:
        return "*"
    return ",".join(_item(rng, low, high, names) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def _schedule(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice(["@yearly", "@monthly", "@weekly", "@daily", "@hourly"])
    return " ".join([_field(rng, 0, 59, None, 0.1), _field(rng, 0, 23, None, 0.4),
                     _field(rng, 1, 31, None, 0.6), _field(rng, 1, 12, MONTHS, 0.7),
                     _field(rng, 0, 6, WEEKDAYS, 0.7)])


def _clock_changes(tz: ZoneInfo) -> list[datetime]:
    """Instants (to the minute) where the zone's offset changes, 2019 to 2026."""
    changes = []
    day = datetime(2019, 1, 1, tzinfo=UTC)
    while day.year < 2027:
        following = day + timedelta(days=1)
        if day.astimezone(tz).utcoffset() != following.astimezone(tz).utcoffset():
            low, high = day, following
            while high - low > timedelta(minutes=1):
                middle = low + (high - low) / 2
                middle = middle.replace(second=0, microsecond=0)
                if middle.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset():
                    low = middle
                else:
                    high = middle
            changes.append(high)
        day = following
    return changes


def _queries(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    changes = {zone: _clock_changes(ZoneInfo(zone)) for zone in ZONES}
    queries = []
    for _ in range(count):
        zone = rng.choice(ZONES)
        if changes[zone] and rng.random() < 0.7:
            start = rng.choice(changes[zone]) + timedelta(
                minutes=rng.randint(-24 * 60, 4 * 60), seconds=rng.choice([0, 0, 1, 59]))
        else:
            start = datetime(2019, 1, 1, tzinfo=UTC) + timedelta(
                seconds=rng.randint(0, 8 * 365 * 86400))
        queries.append({"spec": _schedule(rng), "zone": zone,
                        "start": int(start.timestamp()), "count": FIRE_TIMES})
    return queries


def _ours(query: dict[str, Any]) -> list[int]:
    schedule, tz = Schedule.parse(query["spec"]), ZoneInfo(query["zone"])
    times: list[int] = []
    t: datetime | None = datetime.fromtimestamp(query["start"], UTC)
    for _ in range(query["count"]):
        t = schedule.next_after(t, tz) if t is not None else None
        if t is None:
            times.append(0)
            break
        times.append(int(t.timestamp()))
    return times


def test_fire_times_agree_with_robfig(robfig: Path) -> None:
    queries = _queries(seed=20240331, count=1500)
    result = subprocess.run([str(robfig)], input="".join(json.dumps(q) + "\n" for q in queries),
                            capture_output=True, text=True, check=True, timeout=120)
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == len(queries)
    differences = [(q, theirs, _ours(q)) for q, theirs in zip(queries, answers, strict=True)
                   if _ours(q) != theirs]
    assert differences == []


def test_the_harness_sees_robfigs_fall_back_double_run(robfig: Path) -> None:
    """The comparison above is only worth something if robfig answers; pin one answer."""
    query = {"spec": "0 1 * * *", "zone": "America/New_York",
             "start": int(datetime.fromisoformat("2024-11-03T00:00:00-04:00").timestamp()),
             "count": 3}
    result = subprocess.run([str(robfig)], input=json.dumps(query) + "\n",
                            capture_output=True, text=True, check=True, timeout=60)
    expected = ["2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00",
                "2024-11-04T01:00:00-05:00"]
    assert json.loads(result.stdout) == [int(datetime.fromisoformat(t).timestamp())
                                         for t in expected]
    assert _ours(query) == json.loads(result.stdout)
