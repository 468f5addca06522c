"""The process-kubelet's pod-spec rules (guardedcron_devenv.pod_spec), without a cluster:
the e2e suite runs them against a real API server; these pin the Kubernetes rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guardedcron_devenv.pod_spec import Image, argv_for, expand, field_value, mounts_for, rewrite

IMAGE = Image(entrypoint=["/bin/entry"], cmd=["--default"])
POD: dict[str, Any] = {
    "metadata": {"name": "p-1", "namespace": "billing", "uid": "u-1",
                 "labels": {"app": "invoices"}, "annotations": {"a.io/x": "y"}},
    "spec": {"serviceAccountName": "runner"},
}


def test_expansion_replaces_defined_names_keeps_the_rest_and_unescapes_dollars() -> None:
    env = {"A": "1", "B.c": "2"}
    assert expand("$(A)-$(B.c)-$(MISSING)-$$(A)-$$$(A)-$", env) == "1-2-$(MISSING)-$(A)-$1-$"


@pytest.mark.parametrize(
    ("spec", "argv"),
    [
        ({}, ["/bin/entry", "--default"]),  # the image's entrypoint and default args
        ({"args": ["x"]}, ["/bin/entry", "x"]),  # args replace the default args only
        ({"command": ["run"]}, ["run"]),  # command replaces both
        ({"command": ["run"], "args": ["$(A)"]}, ["run", "1"]),
    ],
)
def test_command_replaces_the_entrypoint_and_args_the_default_args(
    spec: dict[str, Any], argv: list[str]
) -> None:
    assert argv_for(spec, IMAGE, {"A": "1"}) == argv


def test_the_longest_mount_path_is_rewritten_first(tmp_path: Path) -> None:
    volumes = {"outer": tmp_path / "outer", "inner": tmp_path / "inner"}
    spec = {"volumeMounts": [{"name": "outer", "mountPath": "/run/gc/"},
                             {"name": "inner", "mountPath": "/run/gc/out", "subPath": "s"}]}
    mounts = mounts_for(spec, volumes)
    assert rewrite("--out=/run/gc/out/x --dir=/run/gc/y", mounts) == (
        f"--out={tmp_path}/inner/s/x --dir={tmp_path}/outer/y"
    )


def test_a_mount_of_an_undefined_volume_is_refused() -> None:
    with pytest.raises(RuntimeError, match="volume 'gone' is not defined in the pod"):
        mounts_for({"volumeMounts": [{"name": "gone", "mountPath": "/x"}]}, {})


def test_downward_api_fields() -> None:
    assert [field_value(POD, "node-a", path) for path in (
        "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
        "spec.serviceAccountName", "metadata.labels['app']", "metadata.annotations['a.io/x']",
        "metadata.labels['absent']",
    )] == ["p-1", "billing", "u-1", "node-a", "runner", "invoices", "y", ""]
    with pytest.raises(RuntimeError, match=r"fieldRef 'status\.phase' is not supported"):
        field_value(POD, "node-a", "status.phase")
