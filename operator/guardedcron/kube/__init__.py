"""The small asynchronous Kubernetes API client the operator writes through."""

from guardedcron.kube.client import KubeClient
from guardedcron.kube.credentials import discover_credentials
from guardedcron.kube.errors import ApiError, ApiUnreachable, Conflict, KubeError, NotFound, Unauthorized
from guardedcron.kube.resources import CRONJOBS, EVENTS, GUARDED_CRONJOBS, JOBS, PODS, SECRETS, Resource

__all__ = [
    "CRONJOBS",
    "EVENTS",
    "GUARDED_CRONJOBS",
    "JOBS",
    "PODS",
    "SECRETS",
    "ApiError",
    "ApiUnreachable",
    "Conflict",
    "KubeClient",
    "KubeError",
    "NotFound",
    "Resource",
    "Unauthorized",
    "discover_credentials",
]
