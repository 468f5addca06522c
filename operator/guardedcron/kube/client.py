"""A small asynchronous Kubernetes API client over aiohttp.

Why not kubernetes_asyncio: its import alone costs tens of MiB of resident memory
and seconds of start-up, and the operator needs six calls. Credentials come from
kopf's login (a `kopf.ConnectionInfo`: server, CA or insecure, token, basic auth or
client certificate), so the operator and kopf talk to the same API server the same
way. Every call is a coroutine on the event loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import kopf

from guardedcron import __version__, contract
from guardedcron.kube.credentials import tls_server_name
from guardedcron.kube.errors import ApiError, ApiUnreachable, Unauthorized, error_from_response
from guardedcron.kube.resources import PODS, Resource

# Returns fresh credentials (re-reading a rotated service-account token, say).
CredentialsSource = Callable[[], Awaitable[kopf.ConnectionInfo | None]]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
# Server-side apply takes YAML; JSON is YAML, and keeps the body exact.
APPLY_PATCH = "application/apply-patch+yaml"
LIST_PAGE_SIZE = 500
CONNECTIONS = 32  # to one API server; kopf's watches have their own session
# A busy API server answers 429 (API Priority and Fairness, --max-requests-inflight)
# before doing anything, with Retry-After: the request is sent again after that many
# seconds (at most BUSY_WAIT_MAX_SECONDS, plus up to a second of jitter so that the
# rejected requests do not all come back at once), at most BUSY_RETRIES times; then the
# 429 goes to the caller (the pass runs again). One call waits at most
# BUSY_RETRIES * (BUSY_WAIT_MAX_SECONDS + 1) = 110 s for a busy server.
BUSY_RETRIES = 10
BUSY_WAIT_MAX_SECONDS = 10.0
BUSY_WAIT_DEFAULT_SECONDS = 1.0
TOO_MANY_REQUESTS = 429


class KubeClient:
    """One HTTP session to one API server. Call `use()` with credentials before the
    first request (kopf's login handler does), and `close()` at the end."""

    def __init__(
        self,
        info: kopf.ConnectionInfo | None = None,
        *,
        relogin: CredentialsSource | None = None,
        timeout_seconds: float = 30.0,
        busy_retries: int = BUSY_RETRIES,
    ) -> None:
        self._info = info
        self._relogin = relogin
        self._busy_retries = busy_retries
        # Per socket operation, not per call: at start-up a thousand passes queue for
        # the connection pool, and waiting there is no sign of a dead server.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                              sock_connect=timeout_seconds, sock_read=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self._session_lock = asyncio.Lock()

    @property
    def server(self) -> str | None:
        return self._info.server if self._info is not None else None

    async def use(self, info: kopf.ConnectionInfo, *, relogin: CredentialsSource | None = None) -> None:
        """Switch to these credentials; a changed login gets a new session. `relogin`,
        if given, is asked once for fresh credentials when the API server answers 401."""
        if relogin is not None:
            self._relogin = relogin
        if info == self._info:
            return
        self._info = info
        old, self._session = self._session, None
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- the calls the operator makes

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", resource.path(namespace, name))
        return result

    async def pages(self, resource: Resource, namespace: str | None = None, *,
                    label_selector: str | None = None) -> AsyncIterator[list[dict[str, Any]]]:
        """Every object, one page (LIST_PAGE_SIZE objects) at a time."""
        params: dict[str, str] = {"limit": str(LIST_PAGE_SIZE)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            page = await self._request("GET", resource.path(namespace), params=params)
            yield list(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            params["continue"] = token

    async def list(self, resource: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        """Every object; `namespace` None lists across all namespaces."""
        return [item async for page in self.pages(resource, namespace, label_selector=label_selector)
                for item in page]

    async def apply(self, resource: Resource, body: Mapping[str, Any], *,
                    field_manager: str = contract.FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply `body` (its metadata names the object), taking over
        conflicting fields (`force`): the operator is the one owner of what it sets."""
        metadata = body["metadata"]
        path = resource.path(metadata.get("namespace"), metadata["name"])
        result: dict[str, Any] = await self._request(
            "PATCH", path, params={"fieldManager": field_manager, "force": "true"},
            body=body, content_type=APPLY_PATCH)
        return result

    async def merge_patch(self, resource: Resource, namespace: str | None, name: str,
                          patch: Mapping[str, Any], *, subresource: str | None = None,
                          field_manager: str = contract.FIELD_MANAGER) -> dict[str, Any]:
        """JSON merge patch (RFC 7386): None deletes a key, lists are replaced whole."""
        result: dict[str, Any] = await self._request(
            "PATCH", resource.path(namespace, name, subresource),
            params={"fieldManager": field_manager}, body=patch, content_type=MERGE_PATCH)
        return result

    async def patch_status(self, resource: Resource, namespace: str | None, name: str,
                           status: Mapping[str, Any]) -> dict[str, Any]:
        return await self.merge_patch(resource, namespace, name, {"status": status},
                                      subresource="status")

    async def create(self, resource: Resource, namespace: str | None,
                     body: Mapping[str, Any], *,
                     field_manager: str = contract.FIELD_MANAGER) -> dict[str, Any]:
        result: dict[str, Any] = await self._request(
            "POST", resource.path(namespace), params={"fieldManager": field_manager},
            body=body, content_type=JSON)
        return result

    async def delete(self, resource: Resource, namespace: str | None, name: str, *,
                     uid: str | None = None) -> None:
        """Delete, dependents in the background; with `uid`, only that instance (the API
        server answers 409 if the name now belongs to another object)."""
        body: dict[str, Any] | None = None
        if uid is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._request("DELETE", resource.path(namespace, name),
                            params={"propagationPolicy": "Background"}, body=body,
                            content_type=JSON if body is not None else None)

    async def server_version(self) -> dict[str, Any]:
        """The API server's /version (gitVersion, platform, ...)."""
        result: dict[str, Any] = await self._request("GET", "/version")
        return result

    async def pod_log(self, namespace: str, name: str, *, tail_lines: int) -> str:
        """The last `tail_lines` lines a pod's (only or default) container wrote."""
        log: str = await self._request("GET", PODS.path(namespace, name, "log"),
                                       params={"tailLines": str(tail_lines)}, text=True)
        return log

    # --- plumbing

    async def _request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                       body: Mapping[str, Any] | None = None,
                       content_type: str | None = None, text: bool = False) -> Any:
        """The answer's JSON (or, with `text`, its body as it came)."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Accept": JSON}
        if content_type is not None:
            headers["Content-Type"] = content_type
        retried_login = False
        busy = 0
        while True:
            session = await self._session_now()
            url = self._info.server.rstrip("/") + path if self._info is not None else path
            server_name = tls_server_name(self._info) if self._info is not None else None
            try:
                async with session.request(method, url, params=params, data=data, headers=headers,
                                           server_hostname=server_name) as response:
                    answer = await response.text()
                    status = response.status
                    retry_after = response.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise ApiUnreachable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            if status < 400:
                return answer if text else json.loads(answer) if answer else None
            if status == TOO_MANY_REQUESTS and busy < self._busy_retries:
                busy += 1  # refused before it was handled: sending it again is safe
                await asyncio.sleep(busy_wait_seconds(retry_after) + random.random())
                continue
            error = _decode_error(status, answer)
            if isinstance(error, Unauthorized) and self._relogin is not None and not retried_login:
                # A bound service-account token rotates; read it again, once.
                retried_login = True
                fresh = await self._relogin()
                if fresh is not None:
                    await self.use(fresh)
                    continue
            raise error

    async def _session_now(self) -> aiohttp.ClientSession:
        async with self._session_lock:  # concurrent first requests share one session
            if self._session is None:
                self._session = await self._new_session()
            return self._session

    async def _new_session(self) -> aiohttp.ClientSession:
        info = self._info
        if info is None:
            raise ApiUnreachable("no Kubernetes credentials yet (kopf's login has not run)")
        # Building the TLS context reads CA and key files (and kopf writes inline key data
        # to a temporary file): file I/O, so off the event loop.
        ssl_context = (await asyncio.to_thread(info.as_ssl_context)
                       if info.server.startswith("https:") else False)
        headers = info.as_http_headers()
        headers["User-Agent"] = f"guardedcron/{__version__}"
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS, ssl=ssl_context), headers=headers,
            timeout=self._timeout, proxy=info.proxy_url, trust_env=info.trust_env)


def busy_wait_seconds(retry_after: str | None) -> float:
    """Seconds a 429's Retry-After asks for (delta-seconds, as the API server sends),
    within [0, BUSY_WAIT_MAX_SECONDS]; a missing or unreadable value waits a second."""
    try:
        seconds = float(retry_after) if retry_after is not None else BUSY_WAIT_DEFAULT_SECONDS
    except ValueError:
        seconds = BUSY_WAIT_DEFAULT_SECONDS
    if seconds != seconds:  # NaN
        seconds = BUSY_WAIT_DEFAULT_SECONDS
    return min(max(seconds, 0.0), BUSY_WAIT_MAX_SECONDS)


def _decode_error(status: int, text: str) -> ApiError:
    try:
        body: object = json.loads(text)
    except ValueError:
        body = None
    return error_from_response(status, body, text)
