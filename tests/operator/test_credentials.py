"""In-cluster credentials: the API server's address comes from the kubelet's service
variables, as client-go reads them, not from cluster DNS. The login itself, with a real
service account token in a real pod, is tests/node/test_user_path.py's operator."""

from __future__ import annotations

from guardedcron.kube.credentials import in_cluster_server


def test_the_service_variables_name_the_server() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://10.0.0.1:443"
    assert in_cluster_server({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
    assert in_cluster_server({}) is None
