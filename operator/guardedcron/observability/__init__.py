"""Prometheus metrics and Kubernetes Event bodies for run status (no Kubernetes I/O)."""

from guardedcron.observability.events import build_event, event_name
from guardedcron.observability.metrics import (
    Metrics,
    MetricsServer,
    create_metrics,
    forget,
    observe_reconcile,
    reconcile_timer,
    record_events,
    record_runs,
    record_status_change,
    start_metrics_server,
    update_gauges,
)

__all__ = [
    "Metrics",
    "MetricsServer",
    "build_event",
    "create_metrics",
    "event_name",
    "forget",
    "observe_reconcile",
    "reconcile_timer",
    "record_events",
    "record_runs",
    "record_status_change",
    "start_metrics_server",
    "update_gauges",
]
