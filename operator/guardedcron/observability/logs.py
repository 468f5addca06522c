"""The operator's log lines: kopf's text format, or one JSON object per line.

`--log-format json` is for log pipelines (Loki, Elasticsearch, Cloud Logging): every
line is one JSON object, with the object the line is about as fields of their own, so
a query can select one GuardedCronJob's lines without parsing the message:

    {"time": "2026-12-01T05:00:00.123Z", "level": "info", "logger": "kopf.objects",
     "message": "...", "kind": "GuardedCronJob", "namespace": "team-a", "name": "nightly"}

`kind`, `namespace` and `name` come from kopf's per-object logger, which every handler
logs through; a line about the operator as a whole has none of them. A traceback is
the string field `exception`. kopf has a JSON formatter of its own, but it nests the
object under one key and depends on python-json-logger's version; this one is the
standard library's json, and its fields are the contract above.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Final

from guardedcron.spec.settings import LOG_LEVELS

LOG_FORMATS: Final = ("text", "json")
DEFAULT_LOG_FORMAT: Final = "text"
# The fields of kopf's object reference (the record's k8s_ref) a JSON line carries.
OBJECT_FIELDS: Final = ("kind", "namespace", "name")


class JsonLines(logging.Formatter):
    """One JSON object per record; newlines inside a message stay inside its string."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            entry.update({key: ref[key] for key in OBJECT_FIELDS if ref.get(key)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = DEFAULT_LOG_FORMAT) -> None:
    """kopf's handler on the root logger at `level` (a key of LOG_LEVELS), its lines in
    `log_format` (one of LOG_FORMATS)."""
    import kopf

    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    threshold = LOG_LEVELS[level]
    kopf.configure(debug=threshold <= logging.DEBUG, quiet=threshold >= logging.WARNING)
    root = logging.getLogger()
    root.setLevel(threshold)
    if log_format == "json":
        for handler in root.handlers:
            handler.setFormatter(JsonLines())
