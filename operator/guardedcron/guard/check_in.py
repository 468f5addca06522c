"""The keeper's check-in pings: a dead man's switch outside the cluster (spec.checkIn).

healthchecks.io style, which Cronitor and Sentry's cron monitors accept alike: POST
`<url>/start` once the keeper holds the lease, `<url>` once it released it after the
workload stopped, `<url>/fail` when the lease was lost (docs/design.md, "Check-in pings").

The URL carries the check's key, so it is a secret: it comes from the environment
(`$GUARDEDCRON_CHECK_IN_URL`, from a Secret), is registered with the redaction (every
message the keeper prints is redacted), and messages name only its scheme and host.

Every ping runs in a daemon thread and is bounded (PING_SECONDS in all, connect
included, one retry at most); the keeper never waits on it except, at its end, for what
remains of its own bounds. Any failure is one log line and nothing else: a ping never
changes the keeper's timing or exit code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from guardedcron.guard.redaction import hide

PING_SECONDS: Final = 5.0  # one ping, all attempts and connects together
ATTEMPTS: Final = 2  # one retry, for a refused connection, a timeout or a 5xx answer
RETRY_AFTER_SECONDS: Final = 0.2
MIN_ATTEMPT_SECONDS: Final = 0.2  # less left than this: no further attempt
SCHEMES: Final = ("http", "https")
START: Final = "start"
FAIL: Final = "fail"
FINISH: Final = ""  # the bare URL: healthchecks' success ping
SECRET_PIECE_MIN: Final = 8


class CheckInRefused(ValueError):
    """The URL cannot be pinged; the message names no part of it past the scheme."""


class CheckIn:
    """One check-in URL; `ping` starts a bounded ping in a daemon thread."""

    def __init__(self, url: str, log: Callable[[str], None]) -> None:
        from urllib.parse import urlsplit  # only for keepers that ping: start-up cost

        hide([url, *_secret_parts(url)])  # before anything could quote it
        try:
            parts = urlsplit(url.strip())
            host = parts.hostname
        except ValueError:
            raise CheckInRefused("the check-in URL is not a URL") from None
        if parts.scheme.lower() not in SCHEMES:
            shown = parts.scheme[:10] if parts.scheme.isalnum() else "?"
            raise CheckInRefused(f"the check-in URL must be http or https, not {shown!r}")
        if not host:
            raise CheckInRefused("the check-in URL names no host")
        self._parts = parts
        self.origin = f"{parts.scheme.lower()}://{host}"  # all a message may say of it
        self._log = log

    def url(self, what: str) -> str:
        """The URL of one ping: `what` appended to the path, the query kept."""
        path = self._parts.path.rstrip("/")
        return self._parts._replace(path=f"{path}/{what}" if what else path or "/").geturl()

    def ping(self, what: str, body: str, *, seconds: float = PING_SECONDS) -> threading.Thread:
        """Send one ping in a daemon thread, within `seconds`; join it to wait for it."""
        thread = threading.Thread(target=self._send, args=(what, body, seconds), daemon=True)
        thread.start()
        return thread

    def _send(self, what: str, body: str, seconds: float) -> None:
        from urllib.error import HTTPError
        from urllib.request import Request, urlopen

        name = what or "finish"
        ends = time.monotonic() + seconds
        error = "no time left"
        for attempt in range(ATTEMPTS):
            left = ends - time.monotonic()
            if left < MIN_ATTEMPT_SECONDS:
                break
            request = Request(self.url(what), data=body.encode(), method="POST",
                              headers={"Content-Type": "text/plain; charset=utf-8"})
            try:
                # The timeout bounds the connect and each read; the caller's join bounds the whole.
                with urlopen(request, timeout=left) as answer:
                    answer.read(1024)
                self._log(f"check-in {name} sent to {self.origin}")
                return
            except HTTPError as exc:
                error = f"answered {exc.code}"
                if exc.code < 500:
                    break  # the service refused it: asking again changes nothing
            except Exception as exc:  # every other failure: one line, never the run's end
                error = _reason(exc)
            if attempt + 1 < ATTEMPTS:
                time.sleep(min(RETRY_AFTER_SECONDS, max(0.0, ends - time.monotonic())))
        self._log(f"check-in {name} to {self.origin} not sent: {error}")


def _secret_parts(url: str) -> list[str]:
    """What of the URL may carry the check's key: the part after the host, and its pieces."""
    rest = url.strip().split("//", 1)[-1]
    path = rest.partition("/")[2]
    pieces = path.replace("?", "/").replace("&", "/").replace("=", "/").split("/")
    # Keys are long (a UUID, 22 random characters); short pieces are words ("p", "ping")
    # whose hiding would garble messages and protect nothing.
    return [path, *(piece for piece in pieces if len(piece) >= SECRET_PIECE_MIN)]


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)  # URLError wraps the socket's error
    text = str(reason if reason is not None else exc) or type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__
