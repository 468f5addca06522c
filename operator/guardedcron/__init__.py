"""guardedcron: scheduled Kubernetes jobs that run once, guarded by a PostgreSQL lease."""

__version__ = "0.1.0"
