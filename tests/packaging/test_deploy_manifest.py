"""charts/kubectl/operator.yaml (the kubectl install) is the chart, rendered, unchanged."""

from __future__ import annotations

import importlib.util

import yaml

from tests.support.chart import REPO


def test_operator_manifest_equals_the_rendered_chart() -> None:
    spec = importlib.util.spec_from_file_location("deploy_render", REPO / "charts" / "kubectl" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.OUTPUT.read_text() == module.render(), (
        "charts/kubectl/operator.yaml is stale: run .venv/bin/python charts/kubectl/render.py"
    )


def test_operator_manifest_leaves_crds_to_the_crds_folder() -> None:
    manifest = (REPO / "charts" / "kubectl" / "operator.yaml").read_text()
    kinds = [doc["kind"] for doc in yaml.safe_load_all(manifest) if doc]
    assert "CustomResourceDefinition" not in kinds
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= set(kinds)
