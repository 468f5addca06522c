"""Errors of the Kubernetes API client, carrying the API server's own words.

A refused CronJob (an invalid pod template, say) must reach the GuardedCronJob's
status with the message the API server gave, so `ApiError.message` is that message
unchanged and `str(error)` adds only the HTTP status and reason in front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KubeError(Exception):
    """Any failure to talk to the Kubernetes API."""


class ApiUnreachable(KubeError):
    """No HTTP answer: connection refused or reset, TLS failure, timeout."""


class ApiError(KubeError):
    """The API server answered with an error status (a `kind: Status` body, usually)."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Mapping[str, Any] | None = None) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}
        super().__init__(f"{code} {reason}: {message}")

    @property
    def permanent(self) -> bool:
        """Whether sending the same request again cannot succeed: the request itself is
        wrong (400 bad request, 422 invalid), so only a change of the object fixes it."""
        return self.code in (400, 422)

    @property
    def namespace_terminating(self) -> bool:
        """Refused because the namespace is being deleted: there is nothing left to repair."""
        causes = self.details.get("causes") or ()
        return self.code == 403 and any(
            isinstance(cause, Mapping) and cause.get("reason") == "NamespaceTerminating" for cause in causes
        )


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Unauthorized(ApiError):
    pass


_BY_CODE: dict[int, type[ApiError]] = {401: Unauthorized, 404: NotFound, 409: Conflict}


def error_from_response(code: int, body: object, fallback_text: str) -> ApiError:
    """The error for an HTTP error answer; `body` is the decoded JSON, if it was JSON."""
    reason = ""
    message = ""
    details: Mapping[str, Any] | None = None
    if isinstance(body, Mapping):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
        raw_details = body.get("details")
        details = raw_details if isinstance(raw_details, Mapping) else None
    if not message:
        message = fallback_text.strip()[:500] or "no message"
    return _BY_CODE.get(code, ApiError)(code, reason or _default_reason(code), message, details)


def _default_reason(code: int) -> str:
    return {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            409: "Conflict", 422: "Invalid", 429: "TooManyRequests"}.get(
        code, "InternalError" if code >= 500 else "Error")
