"""A tiny synchronous client for a local control plane, as its admin (client certificate).

Used by the process-kubelet and the demo, which run in their own threads; the
operator has its own async client (guardedcron.kube).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, code: int, body: str) -> None:
        self.code = code
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {code} {message}")


class AdminApi:
    def __init__(self, server: str, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.server = server.rstrip("/")
        self._tls = ssl.create_default_context(cafile=str(ca_file))
        self._tls.load_cert_chain(str(cert_file), str(key_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._tls, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(method, path, exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(text) if text else None

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, **query: str) -> Any:
        return self.request("DELETE", path, query=query or None)
