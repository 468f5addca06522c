"""Prometheus metrics and Kubernetes Event bodies for run status (no Kubernetes I/O).

They count and format what status/ decided (`StatusChange`); they decide nothing."""

from guardedcron.observability.events import build_event, event_name
from guardedcron.observability.metrics import (
    Metrics,
    MetricsServer,
    create_metrics,
    forget,
    observe_reconcile,
    reconcile_timer,
    record_changes,
    start_metrics_server,
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
    "record_changes",
    "start_metrics_server",
]
