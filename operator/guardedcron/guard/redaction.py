"""Keep database credentials out of every message the guard prints or leaves behind.

Two layers, because a password can reach a message by many roads (argparse echoing a
misplaced argument, a driver error, an unexpected exception):

- known secrets: the DSN in $GUARDEDCRON_DSN, every command-line value that looks like a
  connection string, and the password inside each, are replaced wherever they occur,
  also in the escaped form `repr()` gives them;
- shapes: anything left that looks like a PostgreSQL URI or a `password=` setting is
  replaced too, so a connection string never seen before is still not shown.

A URI whose password holds an `@` or `/` that is not percent-encoded is read by libpq in
pieces (`postgresql://u:Kq9@Zw4@host/db` has the host `Zw4@host`), so every piece of such
a userinfo is a secret too; `connection.describe` and `connection.scrub` then show nothing
libpq parsed from it.

Only the standard library is used: this runs on every guard start (psycopg's import
alone costs more than the guard's whole budget for start-up).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from guardedcron.contract import ENV_CHECK_IN_URL, ENV_DSN

HIDDEN = "***"
HIDDEN_DSN = "<connection string hidden>"
# A secret shorter than this is not searched for: replacing every "a" would garble the
# message and protect nothing (such a password is guessed faster than read).
MIN_SECRET_LENGTH = 4

_URI = re.compile(r"postgres(?:ql)?://[^\s'\"]*", re.IGNORECASE)
_PASSWORD_SETTING = re.compile(
    r"(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&'\"]+)", re.IGNORECASE
)
_URI_USERINFO = re.compile(r"^postgres(?:ql)?://([^@/?#]*)@", re.IGNORECASE)
_URI_SCHEME = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# libpq ends a URI's userinfo at its first `@`, or finds none past a `/`: a password with
# either is read in pieces, split at any of the URI's delimiters.
_MISREAD = re.compile(r"[@/]")
_USERINFO_DELIMITERS = re.compile(r"[@:/?#]")

_PERCENT_ESCAPE = re.compile(r"(?:%[0-9a-fA-F]{2})+")

_DSN_OPTIONS = {"--dsn", "--ds", "--d", "--dns"}

_registered: set[str] = set()


def unquote(text: str) -> str:
    """Percent-decoding as in a URI (urllib.parse would cost the start-up ~40 ms)."""
    return _PERCENT_ESCAPE.sub(
        lambda m: bytes.fromhex(m.group(0).replace("%", "")).decode("utf-8", "replace"), text
    )


def looks_like_dsn(value: str) -> bool:
    """A PostgreSQL URI, or text that carries a `password=` setting."""
    return bool(_URI.search(value) or _PASSWORD_SETTING.search(value))


def userinfo_of(dsn: str) -> str | None:
    """A URI's userinfo however malformed: all before its last `@`. libpq ends it at the
    first `@` (and sees none past a `/`), reading the rest as host, port or database."""
    scheme = _URI_SCHEME.match(dsn)
    if scheme is None:
        return None
    rest = dsn[scheme.end():]
    return rest[: rest.rindex("@")] if "@" in rest else None


def passwords_in(dsn: str) -> list[str]:
    """The password(s) a connection string carries, as written and as libpq reads them,
    and for a URI each piece of its userinfo's password (libpq may show any of them)."""
    found: list[str] = []
    userinfo = _URI_USERINFO.match(dsn.strip())
    if userinfo and ":" in userinfo.group(1):
        raw = userinfo.group(1).split(":", 1)[1]
        found += [raw, unquote(raw)]
    whole = userinfo_of(dsn)
    if whole is not None and ":" in whole:  # without a password it is only a user name
        password = whole.partition(":")[2]
        found += [whole, password, unquote(password)]
        if _MISREAD.search(password):
            found += _USERINFO_DELIMITERS.split(password)
    for match in _PASSWORD_SETTING.finditer(dsn):
        raw = match.group(0)[len(match.group(1)):]
        found.append(raw)
        unquoted = raw
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            unquoted = re.sub(r"\\(.)", r"\1", raw[1:-1])
        found += [unquoted, unquote(unquoted)]
    return found


def hide_for_this_run(argv: Sequence[str]) -> None:
    """Start a command: the connection strings among its arguments (and their passwords)
    are hidden in every message from now on, and nothing of an earlier run in this process.
    A value given to --dsn (or an abbreviation argparse accepts, or the typo --dns) is one
    whatever it looks like."""
    _registered.clear()
    hide(arg for arg in argv if looks_like_dsn(arg))
    for index, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in _DSN_OPTIONS:
            hide([value] if equals else argv[index + 1 : index + 2])


def hide(values: Iterable[str | None]) -> None:
    """Hide these values (connection strings, and the passwords in them) from now on."""
    for value in values:
        if value:
            _registered.update(_secrets_of(value))


def _secrets_of(dsn: str) -> set[str]:
    return {s for s in (dsn, dsn.strip(), *passwords_in(dsn)) if len(s) >= MIN_SECRET_LENGTH}


def _known_secrets() -> list[str]:
    secrets = set(_registered)
    env_dsn = os.environ.get(ENV_DSN)
    if env_dsn:
        secrets |= _secrets_of(env_dsn)
    check_in_url = os.environ.get(ENV_CHECK_IN_URL, "").strip()
    if len(check_in_url) >= MIN_SECRET_LENGTH:
        secrets.add(check_in_url)  # the check's key is in it (guard/check_in.py hides its parts)
    forms = set(secrets)
    for secret in secrets:
        escaped = repr(secret)[1:-1]  # how argparse and f"{x!r}" show it
        if len(escaped) >= MIN_SECRET_LENGTH:
            forms.add(escaped)
    # The longest first: a DSN must be hidden whole before its password is searched for.
    return sorted(forms, key=len, reverse=True)


def redact(text: str) -> str:
    """`text` with every known secret, URI and password setting hidden."""
    for secret in _known_secrets():
        if secret in text:
            text = text.replace(secret, HIDDEN)
    text = _URI.sub(HIDDEN_DSN, text)
    return _PASSWORD_SETTING.sub(lambda m: m.group(1) + HIDDEN, text)
