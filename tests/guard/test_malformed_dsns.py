"""No part of a password leaks however its DSN is malformed.

A URI whose password holds an unencoded `@` or `/` is read by libpq at the wrong place:
`postgresql://u:Kq9@Zw4@host/db` has the host `Zw4@host`, and every message naming the
host or quoting libpq named part of the password. Each DSN below goes through the CLI
against the suite's real PostgreSQL and against a closed port, in the environment and as
`--dsn`; no fragment of the password may appear on stdout, stderr or in the termination
message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from guardedcron_devenv.postgres import ThrowawayPostgres, free_port
from tests.guard.test_cli_contract import CODES, check_contract, run
from tests.support import run_cli

# Each piece is a secret of its own: a message that shows one has leaked part of a password.
PIECES = ["Kq9", "Zw4", "Jm2", "Rt5", "Hy8"]
SHAPES = [
    # id, DSN with {host}, {port}, {db}
    ("at", "postgresql://guardedcron:Kq9@Zw4@{host}:{port}/{db}"),
    ("at-twice", "postgresql://guardedcron:Kq9@Zw4@Jm2@{host}:{port}/{db}"),
    ("at-in-user-and-password", "postgresql://gu@rd:Kq9@Zw4@{host}:{port}/{db}"),
    ("at-empty-user", "postgresql://:Kq9@Zw4@{host}:{port}/{db}"),
    ("at-with-a-query", "postgresql://guardedcron:Kq9@Zw4@{host}:{port}/{db}?sslmode=disable"),
    ("colon", "postgresql://guardedcron:Kq9:Zw4@{host}:{port}/{db}"),
    ("slash", "postgresql://guardedcron:Kq9/Zw4@{host}:{port}/{db}"),
    ("slash-and-at", "postgres://guardedcron:Kq9/Zw4@Jm2@{host}:{port}/{db}"),
    ("question-mark", "postgresql://guardedcron:Kq9?Zw4@{host}:{port}/{db}"),
    ("hash", "postgresql://guardedcron:Kq9#Zw4@{host}:{port}/{db}"),
    ("every-delimiter", "postgresql://guardedcron:Kq9@Zw4/Jm2?Rt5#Hy8@{host}:{port}/{db}"),
    ("space", "postgresql://guardedcron:Kq9 Zw4@{host}:{port}/{db}"),
    ("query-password-with-at", "postgresql://guardedcron@{host}:{port}/{db}?password=Kq9@Zw4"),
    ("key-value-quoted", "host={host} port={port} dbname={db} user=guardedcron password='Kq9 Zw4@Jm2'"),
    ("key-value-escaped-quote",
     "host={host} port={port} dbname={db} password = 'Kq9\\' Zw4' user=guardedcron"),
    ("key-value-quote-inside", "host={host} port={port} dbname={db} user=guardedcron password=Kq9@Zw4'Jm2"),
    ("key-value-unquoted-space", "host={host} port={port} dbname={db} user=guardedcron password=Kq9 Zw4"),
]
COMMANDS = {
    "acquire": ["acquire", "--lock", "j", "--holder", "a", "--lease-seconds", "30", "--connect-timeout", "2"],
    "renew": ["renew", "--lock", "j", "--holder", "a", "--fence", "1", "--lease-seconds", "30",
              "--connect-timeout", "2"],
    "runs": ["runs", "--lock", "j", "--connect-timeout", "2"],
    "db": ["db", "status", "--connect-timeout", "2"],
}


def dsns(postgres: ThrowawayPostgres, dsn: str, template: str) -> dict[str, str]:
    """The DSN towards the real server (its database) and towards a port nobody listens on."""
    database = dsn.rsplit("/", 1)[1]
    return {
        "real-server": template.format(host="127.0.0.1", port=postgres.port, db=database),
        "closed-port": template.format(host="127.0.0.1", port=free_port(), db=database),
    }


def assert_hidden(everything: str, answer: object) -> None:
    for piece in PIECES:
        assert piece not in everything, (piece, answer)


@pytest.mark.parametrize("template", [t for _, t in SHAPES], ids=[i for i, _ in SHAPES])
def test_no_piece_of_a_malformed_dsns_password_is_shown(
    template: str, dsn: str, postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    for target in dsns(postgres, dsn, template).values():
        for command, argv in COMMANDS.items():
            for given in ("environment", "argument"):
                if given == "environment":
                    answer = run(argv, target, tmp_path)
                else:
                    answer = run([*argv, "--dsn", target], None, tmp_path)
                assert answer.code in CODES[command] and answer.code != 0, answer
                check_contract(answer, command, [])
                assert_hidden(answer.everything(), answer)


@pytest.mark.parametrize("shape", ["at", "at-in-user-and-password", "slash", "slash-and-at"])
def test_as_real_processes(shape: str, dsn: str, postgres: ThrowawayPostgres, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    for target in dsns(postgres, dsn, dict(SHAPES)[shape]).values():
        log.write_text("")
        result = run_cli(COMMANDS["acquire"], dsn=target, env={"GUARDEDCRON_TERMINATION_LOG": str(log)})
        assert result.code == 69 and "Traceback" not in result.stderr, result
        assert "cannot reach database" in result.stderr
        assert_hidden(result.stdout + result.stderr + log.read_text(), result)
