"""Polling until something holds, for the suites that drive real clusters."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.3) -> T:
    """Poll `check` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(interval)
