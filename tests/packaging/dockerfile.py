"""Read a Dockerfile and its .dockerignore the way `docker build` does, enough to
check the rules of our image and to replay its steps without a Docker engine."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    text: str  # the arguments, continuation lines joined
    line: int

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON array form (ENTRYPOINT ["a"]), or None for the shell form."""
        try:
            value = json.loads(self.text)
        except ValueError:
            return None
        return value if isinstance(value, list) else None

    def flags_and_args(self) -> tuple[dict[str, str], list[str]]:
        words = shlex.split(self.text)
        flags = {}
        while words and words[0].startswith("--"):
            key, _, value = words.pop(0)[2:].partition("=")
            flags[key] = value
        return flags, words


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def parse_instructions(text: str) -> list[Instruction]:
    instructions = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments, even inside a continued instruction, are dropped
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(part for part in pending if part)
        keyword, _, rest = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip(), start))
        pending = []
    return instructions


def parse(text: str) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.text.split()
            base = words[0]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name))
        elif not stages:
            assert instruction.keyword == "ARG", "only ARG may come before the first FROM"
            key, _, default = instruction.text.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def expand(value: str, variables: dict[str, str]) -> str:
    """${NAME} and $NAME as Docker substitutes them in FROM, ENV and friends."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), ""), value
    )


def env_pairs(instruction: Instruction) -> list[tuple[str, str]]:
    """ENV A=1 B="two words" -> [(A, 1), (B, two words)]."""
    return [tuple(word.split("=", 1)) for word in shlex.split(instruction.text)]  # type: ignore[misc]


# --- .dockerignore


def ignore_patterns(text: str) -> list[tuple[bool, str]]:
    """(is_exception, pattern) per line, cleaned the way Docker cleans them."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:].strip() if exception else line
        patterns.append((exception, pattern.strip("/")))
    return patterns


def _glob_regex(pattern: str) -> str:
    """Go filepath.Match plus Docker's '**' (any number of directories)."""
    regex = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            regex, index = regex + "(.*/)?", index + 3
        elif pattern.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif pattern[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif pattern[index] == "?":
            regex, index = regex + "[^/]", index + 1
        elif pattern[index] == "[":
            close = pattern.index("]", index)
            regex, index = regex + pattern[index : close + 1].replace("[^", "[^/"), close + 1
        else:
            regex, index = regex + re.escape(pattern[index]), index + 1
    return regex


def _matches(pattern: str, path: str) -> bool:
    return re.fullmatch(_glob_regex(pattern), path) is not None


def excluded(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for exception, pattern in patterns:
        if any(_matches(pattern, candidate) for candidate in candidates):
            result = not exception
    return result


def build_context(repo: Path, patterns: list[tuple[bool, str]]) -> list[Path]:
    """The files `docker build` would send, relative to the repository."""
    files = []
    for folder, dirs, names in os.walk(repo):
        base = Path(folder).relative_to(repo)
        # Skip whole folders that are excluded and that no exception reaches into.
        dirs[:] = sorted(
            d for d in dirs
            if not (excluded((base / d).as_posix(), patterns)
                    and not _reachable((base / d).as_posix(), patterns))
        )
        for name in sorted(names):
            relative = base / name
            if not excluded(relative.as_posix(), patterns):
                files.append(relative)
    return files


def _reachable(folder: str, patterns: list[tuple[bool, str]]) -> bool:
    return any(
        exception and (pattern.startswith("**") or pattern.startswith(folder + "/"))
        for exception, pattern in patterns
    )
