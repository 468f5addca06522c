"""The one error a GuardedCronJob spec can raise: every problem found, each at its field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Problem(NamedTuple):
    """One reason a spec is invalid, at a field path written the way kubectl shows it."""

    field_path: str
    message: str

    def __str__(self) -> str:
        return f"{self.field_path}: {self.message}"


class SpecError(ValueError):
    """A GuardedCronJob that cannot become a CronJob; holds every problem, not only the first."""

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems: tuple[Problem, ...] = tuple(Problem(path, msg) for path, msg in problems)
        if not self.problems:
            raise ValueError("SpecError needs at least one problem")
        super().__init__("; ".join(str(p) for p in self.problems))
