"""The guard CLI's contract holds for every input (issue 10, holes 7 and 8).

Whatever the arguments and the environment: the exit code is one docs/design.md lists
for that command, nothing prints a traceback, no database password appears on stdout,
stderr or in the termination message, and the termination message fits Kubernetes'
4096 bytes. Hypothesis generates the inputs; the commands run in this process through
`guardedcron.cli.main.main` (a subprocess costs ~0.3 s, which would allow too few
examples), against the real PostgreSQL of the `dsn` fixture, a closed port, or DSNs
that cannot be parsed. A table of regressions pins each input the issue reports, and a
few of them run as real processes too.
"""

from __future__ import annotations

import io
import json
import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guardedcron.cli.main import main, report_internal_error
from guardedcron.contract import (
    BIGINT_MAX,
    ENV_DSN,
    ENV_TERMINATION_LOG,
    EXIT_INTERNAL,
    TERMINATION_MESSAGE_MAX,
)
from guardedcron_devenv.postgres import ThrowawayPostgres, free_port
from tests.support import run_cli

FAKE_PASSWORD = "Hunter2-sEcReT-xyz"
CLOSED_PORT = free_port()  # nothing listens there: connecting fails at once
CLOSED_DSN = f"postgresql://jobs:{FAKE_PASSWORD}@127.0.0.1:{CLOSED_PORT}/billing"
UNPARSEABLE_DSNS = [
    f"host=db password={FAKE_PASSWORD} =broken",
    f"host=db password='{FAKE_PASSWORD}",  # the quote never ends
    f"postgresql://jobs:{FAKE_PASSWORD}@db/billing?nosuchoption=1",
    f"postgresql://jobs:{FAKE_PASSWORD}@[::1/billing",
    FAKE_PASSWORD,
]
# Parsed, but libpq refuses them when connecting, or nothing answers.
UNREACHABLE_DSNS = [
    CLOSED_DSN,
    f"postgresql://jobs:{FAKE_PASSWORD}@127.0.0.1:notaport/billing",
    f"host=127.0.0.1 port=99999999 password={FAKE_PASSWORD}",
]
# What each command may answer (docs/design.md, "The guard > CLI"); never 70 (a bug).
# (db migrate on a database whose schema is current answers like db status.)
CODES = {
    "acquire": {0, 64, 69, 75, 78},
    "renew": {0, 64, 69, 75, 78},
    "release": {0, 64, 69, 75, 78},
    "keep": {0, 64, 69, 76, 78},
    "runs": {0, 1, 64, 69, 78},
    "db": {0, 64, 69, 78},
}
PROPERTY = settings(
    max_examples=40,
    derandomize=True,  # the same examples on every run: CI must not flake on a lucky draw
    deadline=None,  # database calls under a loaded machine; the count bounds the time
    database=None,  # no example files written into the repository
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- running the command in this process ---------------------------------------------------
@dataclass
class Answer:
    code: int
    stdout: str
    stderr: str
    termination: str

    def everything(self) -> str:
        return self.stdout + self.stderr + self.termination


@contextmanager
def environment(values: dict[str, str | None], cwd: Path | None = None) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    saved_cwd = os.getcwd()
    try:
        if cwd is not None:  # a relative --out must land in the test's folder
            os.chdir(cwd)
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for sig, handler in handlers.items():  # keep installs its own
            signal.signal(sig, handler)
        os.chdir(saved_cwd)


def run(argv: list[str], env_dsn: str | None, tmp: Path) -> Answer:
    log = tmp / f"termination-{uuid.uuid4().hex}"
    log.write_text("")  # exists, as /dev/termination-log does in a pod
    out, err = io.StringIO(), io.StringIO()
    termination_log = {ENV_DSN: env_dsn, ENV_TERMINATION_LOG: str(log)}
    with environment(termination_log, cwd=tmp), redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return Answer(code, out.getvalue(), err.getvalue(), log.read_text())


def check_contract(answer: Answer, command: str, secrets: list[str]) -> None:
    assert answer.code in CODES[command], answer
    assert "Traceback" not in answer.stderr, answer.stderr
    for secret in secrets:
        assert secret not in answer.everything(), answer
    assert len(answer.termination.encode()) <= TERMINATION_MESSAGE_MAX
    if answer.termination:
        json.loads(answer.termination)
    if answer.stderr:  # one-line reasons (argparse's usage line aside)
        reasons = [line for line in answer.stderr.splitlines() if not line.startswith("usage:")]
        assert all(line.startswith("guardedcron") or line.startswith(" ") for line in reasons), answer


# --- what Hypothesis draws ------------------------------------------------------------------
EDGE_NUMBERS = [
    "0",
    "-0",
    "1",
    "-1",
    "0.1",
    "0.09999",
    "1e-7",
    "5e-324",
    "1e300",
    "1e400",
    "-1e300",
    "nan",
    "inf",
    "-inf",
    "NaN",
    "604800",
    "604800.0001",
    "604801",
    "36500",
    "36501",
    "2147483647",
    "2147483648",
    "-2147483649",
    str(BIGINT_MAX),
    str(BIGINT_MAX + 1),
    str(-BIGINT_MAX - 2),
    "9" * 5000,
    "0" * 30 + "1",
    "1_000",
    " 5 ",
    "",
    " ",
    "0x10",
    "1e",
    "١٢",
    "12.5",
    "+3",
    "--1",
]
numbers = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)
SQL_LOOKING = [
    "'; DROP TABLE guardedcron.leases; --",
    "a' OR '1'='1",
    "%s",
    "%(lock)s",
    "$1",
    "\\",
    "guardedcron.leases",
    "x\u0000y",
    "\udcff",
    "\u202e\u0301",
    "🔒" * 70,
    f"postgresql://jobs:{FAKE_PASSWORD}@db/x",
    f"password={FAKE_PASSWORD}",
]
names = st.one_of(
    st.sampled_from(SQL_LOOKING),
    st.text(min_size=0, max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=200, max_size=300),
    st.integers(min_value=250, max_value=12_000).map(lambda n: "l" * n),
    st.text(alphabet="\t\n\r\x7f ab", max_size=5),
)


@st.composite
def env_dsns(draw: st.DrawFn, real: str, *, reachable_only: bool = False) -> str | None:
    choices: list[str | None] = [real, real, real, None, "", "   ", *UNPARSEABLE_DSNS]
    if not reachable_only:
        choices += [*UNREACHABLE_DSNS, CLOSED_DSN]
    return draw(st.sampled_from(choices))


Options = dict[str, tuple[st.SearchStrategy[list[str]], st.SearchStrategy[list[str]]]]


@st.composite
def arguments(draw: st.DrawFn, options: Options) -> list[str]:
    """Each option's arguments: all good (the command reaches the database), one hostile
    (the check for that option must answer), or any mixture."""
    mode = draw(st.sampled_from(["good", "one-hostile", "one-hostile", "any"]))
    hostile = draw(st.sampled_from(sorted(options))) if mode == "one-hostile" else None
    argv: list[str] = []
    for name in sorted(options):
        good, bad = options[name]
        if mode == "any":
            argv += draw(st.one_of(good, bad))
        else:
            argv += draw(bad if name == hostile else good)
    return argv


def option(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return values.map(lambda v: [flag, v])


def optional(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), option(flag, values))


good_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-/.", min_size=1, max_size=30)
LOCK = (option("--lock", good_names), option("--lock", names))
HOLDER = (option("--holder", good_names), option("--holder", names))


def leases(upper: float = 600) -> tuple[st.SearchStrategy[list[str]], st.SearchStrategy[list[str]]]:
    good = st.floats(min_value=0.1, max_value=upper).map(repr)
    return option("--lease-seconds", good), option("--lease-seconds", numbers)


def connection(real: str) -> tuple[st.SearchStrategy[list[str]], st.SearchStrategy[list[str]]]:
    good = st.tuples(
        optional("--dsn", st.just(real)), optional("--connect-timeout", st.sampled_from(["2", "5"]))
    )
    hostile = st.tuples(
        optional("--dsn", st.sampled_from([real, *UNREACHABLE_DSNS, *UNPARSEABLE_DSNS, ""])),
        optional("--connect-timeout", st.sampled_from(["1", "0", "-1", "1e300", "nan", "301", "x"])),
    )
    return good.map(lambda p: p[0] + p[1]), hostile.map(lambda p: p[0] + p[1])


def out_dirs(tmp: Path) -> tuple[st.SearchStrategy[list[str]], st.SearchStrategy[list[str]]]:
    fresh = st.integers().map(lambda _: ["--out", str(tmp / f"out-{uuid.uuid4().hex}")])
    hostile = st.sampled_from(
        [
            ["--out", "/proc/version/x"],  # under a file
            ["--out", "/proc/sys/no-such-dir"],  # not writable, even by root
            ["--out", "a\x00b"],
            ["--out", ""],
        ]
    )
    return st.one_of(st.just([]), fresh), hostile


def secrets_of(postgres: ThrowawayPostgres) -> list[str]:
    return [FAKE_PASSWORD, postgres.password]


class Seen:
    """The exit codes a property met: proof that it reached the database, not only the
    argument checks."""

    def __init__(self) -> None:
        self.codes: set[int] = set()

    def __call__(self, answer: Answer) -> Answer:
        self.codes.add(answer.code)
        return answer


# --- the properties -------------------------------------------------------------------------
def test_acquire_keeps_the_contract(dsn: str, postgres: ThrowawayPostgres, tmp_path: Path) -> None:
    seen = Seen()
    slots = st.one_of(
        st.just([]),
        option("--slot", st.integers(0, LAST_MINUTE).map(str)),
        good_names.map(lambda c: ["--job-name", f"{c}-123", "--cronjob", c]),
    )
    hostile_slots = st.one_of(
        option("--slot", numbers),
        st.tuples(names, numbers).map(lambda p: ["--job-name", f"{p[0]}-{p[1]}", "--cronjob", p[0]]),
        st.tuples(names, names).map(lambda p: ["--job-name", p[0], "--cronjob", p[1]]),
    )
    options: Options = {
        "lock": LOCK,
        "holder": HOLDER,
        "lease": leases(),
        "min-hold": (optional("--min-hold-seconds", st.just("0")), option("--min-hold-seconds", numbers)),
        "slot": (slots, hostile_slots),
        "retain-days": (
            optional("--retain-days", st.integers(1, 36500).map(str)),
            option("--retain-days", numbers),
        ),
        "retain-runs": (
            optional("--retain-runs", st.integers(1, 10**6).map(str)),
            option("--retain-runs", numbers),
        ),
        "out": out_dirs(tmp_path),
        "connection": connection(dsn),
    }

    @PROPERTY
    @given(argv=arguments(options), env=env_dsns(dsn))
    @example(argv=["--lock", "j", "--holder", "a", "--lease-seconds", "30"], env=CLOSED_DSN)
    def prop(argv: list[str], env: str | None) -> None:
        check_contract(seen(run(["acquire", *argv], env, tmp_path)), "acquire", secrets_of(postgres))

    prop()
    assert {0, 64, 69} <= seen.codes, seen.codes


# Times, zones and slots at their limits: the last minute a date holds, zones furthest
# ahead of and behind UTC, skipped wall times' keys, and names of tzdata folders.
LAST_MINUTE = 4_223_371_679  # 9999-12-31T23:59Z
SKIPPED_KEYS = 10_000_000_000  # schedule.dst.SKIPPED_SLOT_BASE; + 29_579_190: 2026-03-29 02:30
EDGE_SLOTS = [0, 1, LAST_MINUTE - 1, LAST_MINUTE, LAST_MINUTE + 1, SKIPPED_KEYS - 1, SKIPPED_KEYS,
              SKIPPED_KEYS + 29_579_190, SKIPPED_KEYS + LAST_MINUTE, SKIPPED_KEYS + LAST_MINUTE + 1,
              2**31, 2**53, BIGINT_MAX - 1, BIGINT_MAX]
ZONES = ["UTC", "Etc/GMT-14", "Pacific/Kiritimati", "Etc/GMT+12", "Pacific/Niue", "America/New_York",
         "Europe/Stockholm", "Australia/Lord_Howe", "Pacific/Apia", "Factory", "posixrules"]
NOT_ZONES = ["Europe", "America", "America/Argentina", "Etc", "US", "Local", "localtime", "", " ",
             "Europe/", "/UTC", "../zoneinfo/UTC", "zone1970.tab", "tzdata.zi", "__init__.py",
             "Europe/Stockholm/x", "UTC\x00"]


def test_acquire_at_the_limits_keeps_the_contract(
    dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    """Never a won lease without its files: an input is refused before the database (64),
    or the lease is won with `lease.json` and `fence` written, or the run is skipped (75)."""
    seen = Seen()
    minutes = st.one_of(st.sampled_from(EDGE_SLOTS), st.integers(0, BIGINT_MAX),
                        st.integers(LAST_MINUTE - 2_000, LAST_MINUTE + 2_000))
    slot_options = st.one_of(
        option("--slot", minutes.map(str)),
        minutes.map(lambda m: ["--cronjob", "c", "--job-name", f"c-{m}"]),
        st.just([]),
    )
    zones = st.one_of(st.sampled_from(ZONES), st.sampled_from(NOT_ZONES), names)
    times = st.tuples(
        slot_options,
        optional("--time-zone", zones),
        optional("--repeated-time", st.sampled_from(["Once", "Twice"])),
        optional("--run-kind", st.sampled_from(["catch-up", "backfill", "skipped-time"])),
    ).map(lambda parts: [word for part in parts for word in part])

    @PROPERTY
    @given(times=times, lock=st.integers(0, 3))
    @example(times=["--slot", str(LAST_MINUTE), "--time-zone", "Pacific/Kiritimati"], lock=0)
    @example(times=["--time-zone", "Europe"], lock=0)
    @example(times=["--slot", str(BIGINT_MAX), "--time-zone", "UTC", "--repeated-time", "Once"], lock=0)
    @example(times=["--slot", str(LAST_MINUTE), "--time-zone", "Etc/GMT+12", "--repeated-time", "Once"],
             lock=1)
    def prop(times: list[str], lock: int) -> None:
        out = tmp_path / f"out-{uuid.uuid4().hex}"
        holder = uuid.uuid4().hex
        argv = ["acquire", "--lock", f"limits-{lock}", "--holder", holder, "--lease-seconds", "0.1",
                *times, "--out", str(out)]
        answer = seen(run(argv, dsn, tmp_path))
        check_contract(answer, "acquire", secrets_of(postgres))
        won = answer.code == 0
        assert ('"acquired": true' in answer.stdout) == won, answer
        assert (out / "fence").exists() == won and (out / "lease.json").exists() == won, answer
        if won:
            lease = json.loads((out / "lease.json").read_text())
            assert lease["fence"] == int((out / "fence").read_text()) and lease["holder"] == holder

    prop()
    assert {0, 64} <= seen.codes, seen.codes


@pytest.mark.parametrize("command", ["renew", "release"])
def test_renew_and_release_keep_the_contract(
    command: str, dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    seen = Seen()
    options: Options = {
        "lock": LOCK,
        "holder": HOLDER,
        "connection": connection(dsn),
        "fence": (option("--fence", st.integers(1, BIGINT_MAX).map(str)), option("--fence", numbers)),
    }
    if command == "renew":
        options["lease"] = leases()
    else:
        options["outcome"] = (
            optional("--outcome", st.sampled_from(["succeeded", "failed", "finished"])),
            option("--outcome", st.text(max_size=10)),
        )

    @PROPERTY
    @given(argv=arguments(options), env=env_dsns(dsn))
    @example(argv=["--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "30"], env=CLOSED_DSN)
    def prop(argv: list[str], env: str | None) -> None:
        if command == "release" and "--lease-seconds" in argv:
            argv = argv[: argv.index("--lease-seconds")]  # the one example shared with renew
        check_contract(seen(run([command, *argv], env, tmp_path)), command, secrets_of(postgres))

    prop()
    assert {64, 69, 75} <= seen.codes, seen.codes  # 75: nothing is held in this database


def test_keep_keeps_the_contract(dsn: str, postgres: ThrowawayPostgres, tmp_path: Path) -> None:
    """In its own database nothing is held, so a keeper with good input finds its lease
    gone at the first renewal and exits 76 at once; a closed port is left out (the keeper
    would rightly retry until its lease ends)."""
    seen = Seen()
    fence_file = tmp_path / "fence"
    fence_file.write_text("7\n")
    hostile_file = tmp_path / "hostile-fence"
    options: Options = {
        "lock": LOCK,
        "holder": HOLDER,
        "lease": leases(upper=30),
        "fence": (
            st.one_of(
                option("--fence", st.integers(1, BIGINT_MAX).map(str)),
                st.just(["--fence-file", str(fence_file)]),
            ),
            st.one_of(
                option("--fence", numbers),
                numbers.map(lambda f: ["--fence-file", str(hostile_file), f]),
                st.sampled_from(
                    [
                        ["--fence-file", "/no/such/file"],
                        ["--fence-file", "/proc/self"],
                        ["--fence-file", "a\x00b"],
                        ["--fence-file", "/dev/zero"],
                    ]
                ),
            ),
        ),
        "on-lost": (optional("--on-lost", st.just("exit")), option("--on-lost", st.text(max_size=8))),
        "out": out_dirs(tmp_path),
    }

    @PROPERTY
    @given(argv=arguments(options), env=env_dsns(dsn, reachable_only=True))
    def prop(argv: list[str], env: str | None) -> None:
        if str(hostile_file) in argv:  # the drawn content goes into the file, not the arguments
            at = argv.index(str(hostile_file))
            hostile_file.write_text(argv.pop(at + 1))
        answer = seen(run(["keep", *argv, "--connect-timeout", "2"], env, tmp_path))
        check_contract(answer, "keep", secrets_of(postgres))

    prop()
    assert {64, 76} <= seen.codes, seen.codes


def test_runs_keeps_the_contract(dsn: str, postgres: ThrowawayPostgres, tmp_path: Path) -> None:
    seen = Seen()
    times = st.sampled_from(
        [
            "2026-01-01T00:00:00+00:00",
            "0001-01-01T00:00:00+00:00",
            "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-05:00",
            "1969-12-31T23:59:59+00:00",
            "2026-01-01",
            "yesterday",
            "",
        ]
    )
    schedules = st.one_of(
        st.sampled_from(
            [
                "* * * * *",
                "*/5 * * * *",
                "@hourly",
                "61 * * * *",
                "TZ=UTC * * * *",
                "@every 1h",
                "",
                "* * * * * *",
                "0 0 30 2 *",
            ]
        ),
        st.text(max_size=30),
    )
    zones = st.sampled_from(
        ["UTC", "Europe/Stockholm", "Local", "../../etc/passwd", "Mars/Base", "a" * 70, "\x00"]
    )
    options: Options = {
        "lock": LOCK,
        "limit": (optional("--limit", st.integers(0, 100).map(str)), option("--limit", numbers)),
        "tolerance": (optional("--tolerance-seconds", st.just("60")), option("--tolerance-seconds", numbers)),
        "gaps": (
            st.one_of(st.just([]), st.just(["--gaps", "--schedule", "*/5 * * * *"])),
            st.tuples(schedules, zones).map(lambda p: ["--gaps", "--schedule", p[0], "--time-zone", p[1]]),
        ),
        "window": (
            st.just([]),
            st.tuples(optional("--since", times), optional("--until", times)).map(lambda p: p[0] + p[1]),
        ),
        "flags": (
            st.lists(st.sampled_from(["--overlaps", "--mark-abandoned", "--json"]), unique=True),
            st.lists(st.sampled_from(["--overlaps", "--mark-abandoned", "--json"]), unique=True),
        ),
        "connection": connection(dsn),
    }

    @PROPERTY
    @given(argv=arguments(options), env=env_dsns(dsn))
    @example(argv=["--lock", "j"], env=CLOSED_DSN)
    def prop(argv: list[str], env: str | None) -> None:
        check_contract(seen(run(["runs", *argv], env, tmp_path)), "runs", secrets_of(postgres))

    prop()
    assert {0, 64, 69} <= seen.codes, seen.codes


def test_db_status_and_migrate_keep_the_contract(
    dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    seen = Seen()
    good, hostile = connection(dsn)

    @settings(PROPERTY, max_examples=30)
    @given(action=st.sampled_from(["status", "migrate"]), argv=st.one_of(good, hostile), env=env_dsns(dsn))
    def prop(action: str, argv: list[str], env: str | None) -> None:
        answer = seen(run(["db", action, *argv], env, tmp_path))
        check_contract(answer, "db", secrets_of(postgres))

    prop()
    assert {0, 64, 69} <= seen.codes, seen.codes


def test_arguments_in_any_order_and_place_keep_the_contract(
    dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    """Shuffled and misplaced arguments, misspelt options, a DSN where a value or the
    command should be: argparse's own errors must hide it too."""
    words = st.sampled_from(
        [
            "--lock",
            "--holder",
            "--lease-seconds",
            "--fence",
            "--slot",
            "--dsn",
            "--dns",
            "--ds",
            "--outcome",
            "--limit",
            "--lock=x",
            "-h",
            "--",
            "status",
            "acquire",
            "renew",
            "x",
            "1",
            "0.2",
            dsn,
            CLOSED_DSN,
            *UNPARSEABLE_DSNS[:-1],  # the last is the bare password: secret only as a DSN
            f"--dsn={CLOSED_DSN}",
            f"--dns={dsn}",
            f"--ds={FAKE_PASSWORD}",
        ]
    )

    @PROPERTY
    @given(
        command=st.sampled_from(
            [["acquire"], ["renew"], ["release"], ["keep"], ["runs"], ["db", "status"], []]
        ),
        before=st.lists(words, max_size=3),
        after=st.lists(words, max_size=8),
        env=env_dsns(dsn, reachable_only=True),
    )
    def prop(command: list[str], before: list[str], after: list[str], env: str | None) -> None:
        answer = run([*before, *command, *after], env, tmp_path)
        assert answer.code in set().union(*CODES.values()), answer
        assert "Traceback" not in answer.stderr
        for secret in secrets_of(postgres):
            assert secret not in answer.everything(), answer
        assert len(answer.termination.encode()) <= TERMINATION_MESSAGE_MAX

    prop()


# --- each input the issue reports, pinned -----------------------------------------------------
LEASE = ["--lease-seconds", "30"]
REGRESSIONS = [
    # id, argv, exit code, words on stderr
    (
        "slot-past-bigint",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--slot", str(BIGINT_MAX + 1)],
        64,
        "--slot must be from 0 to 9223372036854775807",
    ),
    (
        "job-name-minute-past-bigint",
        [
            "acquire",
            "--lock",
            "j",
            "--holder",
            "a",
            *LEASE,
            "--cronjob",
            "c",
            "--job-name",
            f"c-{BIGINT_MAX + 1}",
        ],
        64,
        "the scheduled minute in --job-name must be from 0 to",
    ),
    (
        "retain-days-past-int",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--retain-days", "2147483648"],
        64,
        "--retain-days must be from 1 to 36500",
    ),
    (
        "retain-days-a-billion",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--retain-days", "1000000000"],
        64,
        "--retain-days must be from 1 to 36500",
    ),
    (
        "retain-runs-past-int",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--retain-runs", "2147483648"],
        64,
        "--retain-runs must be from 1 to 2147483647",
    ),
    (
        "lease-1e300",
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "1e300"],
        64,
        "--lease-seconds must be from 0.1 to 604800",
    ),
    (
        "lease-1e-7",
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "1e-7"],
        64,
        "--lease-seconds must be from 0.1 to 604800",
    ),
    (
        "lease-over-7-days",
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "604801"],
        64,
        "--lease-seconds must be from 0.1 to 604800",
    ),
    (
        "min-hold-1e300",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--min-hold-seconds", "1e300"],
        64,
        "--min-hold-seconds must be from 0 to 604800",
    ),
    (
        "renew-fence-past-bigint",
        ["renew", "--lock", "j", "--holder", "a", *LEASE, "--fence", str(BIGINT_MAX + 1)],
        64,
        "--fence must be from 1 to 9223372036854775807",
    ),
    (
        "renew-fence-zero",
        ["renew", "--lock", "j", "--holder", "a", *LEASE, "--fence", "0"],
        64,
        "--fence must be from 1 to",
    ),
    (
        "release-fence-negative",
        ["release", "--lock", "j", "--holder", "a", "--fence", "-1"],
        64,
        "--fence must be from 1 to",
    ),
    (
        "renew-lease-1e-7",
        ["renew", "--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "1e-7"],
        64,
        "--lease-seconds must be from 0.1",
    ),
    (
        "keep-lease-1e300",
        ["keep", "--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "1e300"],
        64,
        "--lease-seconds must be from 0.1",
    ),
    (
        "runs-limit-past-bigint",
        ["runs", "--lock", "j", "--limit", str(BIGINT_MAX + 1)],
        64,
        "--limit must be from 0 to",
    ),
    ("runs-limit-negative", ["runs", "--lock", "j", "--limit", "-1"], 64, "--limit must be from 0 to"),
    (
        "runs-tolerance-1e300",
        ["runs", "--lock", "j", "--tolerance-seconds", "1e300"],
        64,
        "--tolerance-seconds must be from 0 to 604800",
    ),
    (
        "runs-since-year-1",
        ["runs", "--lock", "j", "--gaps", "--schedule", "* * * * *", "--since", "0001-01-01T00:00:00+00:00"],
        64,
        "--since must be from 1970-01-01",
    ),
    (
        "runs-window-of-a-century",
        [
            "runs",
            "--lock",
            "j",
            "--gaps",
            "--schedule",
            "* * * * *",
            "--since",
            "1970-01-01T00:00:00+00:00",
            "--until",
            "2070-01-01T00:00:00+00:00",
        ],
        64,
        "narrow the window",
    ),
    (
        "connect-timeout-1e300",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--connect-timeout", "1e300"],
        64,
        "--connect-timeout must be more than 0 and at most 300",
    ),
    (
        "lock-not-utf8",
        ["acquire", "--lock", "j\udcff", "--holder", "a", *LEASE],
        64,
        "--lock must be UTF-8 text",
    ),
    (
        "out-under-a-file",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--out", "/proc/version/x"],
        64,
        "is not a folder this guard can write",
    ),
    (
        "out-with-nul",
        ["acquire", "--lock", "j", "--holder", "a", *LEASE, "--out", "a\x00b"],
        64,
        "is not a folder this guard can write",
    ),
    (
        "keep-out-with-nul",
        ["keep", "--lock", "j", "--holder", "a", "--fence", "1", *LEASE, "--out", "a\x00b"],
        64,
        "is not a folder this guard can write",
    ),
    (
        "keep-out-empty",
        ["keep", "--lock", "j", "--holder", "a", "--fence", "1", *LEASE, "--out", ""],
        64,
        "argument --out: must name a folder",
    ),
    (
        "keep-fence-file-with-nul",
        ["keep", "--lock", "j", "--holder", "a", "--fence-file", "a\x00b", *LEASE],
        64,
        "cannot read --fence-file",
    ),
    (
        "lock-is-a-dsn",
        ["acquire", "--lock", CLOSED_DSN, "--holder", "a", *LEASE],
        64,
        "--lock looks like a database connection string (not shown)",
    ),
]


def database_state(dsn: str) -> tuple[object, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM guardedcron.runs), (SELECT count(*) FROM guardedcron.leases),"
            " (SELECT count(*) FROM guardedcron.slot_claims)"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    ("argv", "code", "words"), [pytest.param(a, c, w, id=i) for i, a, c, w in REGRESSIONS]
)
def test_each_reported_input_is_refused_as_bad_input(
    argv: list[str], code: int, words: str, dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    before = database_state(dsn)
    answer = run(argv, dsn, tmp_path)
    assert (answer.code, answer.stdout) == (code, ""), answer
    assert words in answer.stderr
    check_contract(answer, argv[0], secrets_of(postgres))
    assert database_state(dsn) == before


def test_keep_with_an_unparseable_dsn_exits_64_before_starting(tmp_path: Path) -> None:
    answer = run(
        ["keep", "--lock", "j", "--holder", "a", "--fence", "1", *LEASE], UNPARSEABLE_DSNS[0], tmp_path
    )
    assert answer.code == 64, answer
    assert "the database DSN cannot be parsed (value not shown)" in answer.stderr
    assert "keeping lock" not in answer.stderr and FAKE_PASSWORD not in answer.everything()


def test_a_ten_kilobyte_lock_name_leaves_a_termination_message_kubernetes_keeps(tmp_path: Path) -> None:
    lock = "l" * 10_000
    answer = run(["acquire", "--lock", lock, "--holder", "h" * 10_000, *LEASE], CLOSED_DSN, tmp_path)
    assert answer.code == 64
    message = json.loads(answer.termination)
    assert len(answer.termination.encode()) <= TERMINATION_MESSAGE_MAX
    assert message["outcome"] == "error" and message["exitCode"] == 64
    assert message["lock"].startswith("lll") and len(message["lock"]) < 300


def test_a_termination_message_of_escaped_unicode_still_fits(tmp_path: Path) -> None:
    """253 emoji are within the name limit, but each is 12 bytes once JSON-escaped."""
    answer = run(["acquire", "--lock", "🔒" * 253, "--holder", "🔑" * 253, *LEASE], CLOSED_DSN, tmp_path)
    assert answer.code == 69
    assert len(answer.termination.encode()) <= TERMINATION_MESSAGE_MAX
    assert json.loads(answer.termination)["exitCode"] == 69


def test_at_the_fence_maximum_the_holder_renews_and_others_get_a_clear_78(dsn: str, tmp_path: Path) -> None:
    first = run(["acquire", "--lock", "j", "--holder", "h", "--lease-seconds", "1"], dsn, tmp_path)
    assert first.code == 0, first
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE guardedcron.leases SET fence = %s WHERE lock_name = 'j'", (BIGINT_MAX,))
    renewed = run(
        ["renew", "--lock", "j", "--holder", "h", "--fence", str(BIGINT_MAX), "--lease-seconds", "1"],
        dsn,
        tmp_path,
    )
    assert renewed.code == 0 and json.loads(renewed.stdout)["fence"] == BIGINT_MAX, renewed
    released = run(["release", "--lock", "j", "--holder", "h", "--fence", str(BIGINT_MAX)], dsn, tmp_path)
    assert released.code == 0, released
    taken = run(["acquire", "--lock", "j", "--holder", "next", *LEASE], dsn, tmp_path)
    assert taken.code == 78, taken
    assert "Traceback" not in taken.stderr
    assert json.loads(taken.termination) | {"reason": ""} == {
        "outcome": "error",
        "exitCode": 78,
        "lock": "j",
        "holder": "next",
        "reason": "",
    }


# --- no DSN echoed, argparse included -----------------------------------------------------------
DSN_IN_ARGUMENTS = [
    ("dsn-before-the-command", ["--dsn", "{dsn}", "acquire", "--lock", "j"], "invalid choice"),
    (
        "misspelt-dns",
        ["acquire", "--dns", "{dsn}", "--lock", "j", "--holder", "a", *LEASE],
        "unrecognized arguments",
    ),
    (
        "dsn-positional",
        ["acquire", "{dsn}", "--lock", "j", "--holder", "a", *LEASE],
        "unrecognized arguments",
    ),
    (
        "dsn-as-an-outcome",
        ["release", "--lock", "j", "--holder", "a", "--fence", "1", "--outcome", "{dsn}"],
        "invalid choice",
    ),
    (
        "dsn-as-a-number",
        ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "{dsn}"],
        "must be a number",
    ),
    ("any-dsn-value-before-the-command", ["--dsn", "{password}", "acquire"], "invalid choice"),
    (
        "any-dns-value",
        ["acquire", "--dns", "{password}", "--lock", "j", "--holder", "a", *LEASE],
        "unrecognized arguments",
    ),
    ("dsn-as-a-schedule", ["runs", "--lock", "j", "--gaps", "--schedule", "{dsn}"], "runs"),
]
DSN_SHAPES = [
    f"postgresql://jobs:{FAKE_PASSWORD}@db.internal:5432/billing",
    f"postgres://jobs:{FAKE_PASSWORD.replace('-', '%2D')}@db/billing",
    f"host=db user=jobs password={FAKE_PASSWORD} dbname=billing",
    f"host=db user=jobs password = '{FAKE_PASSWORD} with spaces' dbname=billing",
]


@pytest.mark.parametrize(
    "shape", DSN_SHAPES, ids=["uri", "uri-percent-encoded", "conninfo", "conninfo-quoted"]
)
@pytest.mark.parametrize(("argv", "words"), [pytest.param(a, w, id=i) for i, a, w in DSN_IN_ARGUMENTS])
def test_a_dsn_in_the_arguments_is_never_echoed(
    argv: list[str], words: str, shape: str, tmp_path: Path
) -> None:
    answer = run(
        [a.replace("{dsn}", shape).replace("{password}", FAKE_PASSWORD) for a in argv], None, tmp_path
    )
    assert answer.code == 64, answer
    assert words in answer.stderr
    assert FAKE_PASSWORD not in answer.everything() and "Hunter2" not in answer.everything(), answer
    assert "Traceback" not in answer.stderr


def test_the_last_resort_says_one_line_without_the_password(tmp_path: Path) -> None:
    """No documented input reaches it (the properties above); a bug must still end in a
    code of the contract, one line, no traceback, no password, and a termination message."""
    log = tmp_path / "termination"
    log.write_text("")
    err = io.StringIO()
    bug = RuntimeError(f"boom\nwhile talking to {CLOSED_DSN}\n  and password={FAKE_PASSWORD}")
    with environment({ENV_DSN: CLOSED_DSN, ENV_TERMINATION_LOG: str(log)}), redirect_stderr(err):
        code = report_internal_error("acquire", ["acquire", "--lock", "j", "--holder", "h"], bug)
    assert code == EXIT_INTERNAL == 70
    assert err.getvalue().count("\n") == 1
    assert err.getvalue().startswith(
        "guardedcron acquire: unexpected error (RuntimeError): boom while talking to"
    )
    assert FAKE_PASSWORD not in err.getvalue() + log.read_text()
    assert json.loads(log.read_text())["exitCode"] == 70


# --- a few as real processes -----------------------------------------------------------------
def test_as_real_processes(dsn: str, postgres: ThrowawayPostgres, tmp_path: Path) -> None:
    log = tmp_path / "termination"
    log.write_text("")
    env = {ENV_TERMINATION_LOG: str(log)}
    cases = [
        (["--dsn", dsn, "acquire", "--lock", "j"], None, 64),
        (["acquire", "--dns", dsn, "--lock", "j", "--holder", "a", *LEASE], None, 64),
        (["renew", "--lock", "j", "--holder", "a", "--fence", str(BIGINT_MAX + 1), *LEASE], dsn, 64),
        (["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "1e300"], dsn, 64),
        (["keep", "--lock", "j", "--holder", "a", "--fence", "1", *LEASE], UNPARSEABLE_DSNS[0], 64),
        (["acquire", "--lock", "l" * 10_000, "--holder", "a", *LEASE], dsn, 64),
    ]
    for argv, env_dsn, code in cases:
        result = run_cli(argv, dsn=env_dsn, env=env)
        assert result.code == code, (argv[:3], result)
        assert "Traceback" not in result.stderr
        for secret in secrets_of(postgres):
            assert secret not in result.stdout + result.stderr + log.read_text()
    assert len(log.read_bytes()) <= TERMINATION_MESSAGE_MAX
