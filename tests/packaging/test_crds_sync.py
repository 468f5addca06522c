"""crds/ is the one source of the CRDs; the chart installs exactly those."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, REPO, by_kind, helm, render

SOURCE = REPO / "crds"


def source_crds() -> dict[str, dict[str, Any]]:
    crds = {}
    for path in sorted(SOURCE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                crds[doc["metadata"]["name"]] = doc
    return crds


def rendered_crds(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    objects = by_kind(render(values), "CustomResourceDefinition")
    return {crd["metadata"]["name"]: crd for crd in objects if crd["spec"]["group"] != "kopf.dev"}


def test_crds_folder_holds_the_guardedcronjob_crd() -> None:
    assert "guardedcronjobs.guardedcron.io" in source_crds()


def test_chart_reads_crds_through_a_link_to_the_source() -> None:
    link = CHART / "files" / "crds"
    assert link.is_symlink(), "charts/guardedcron/files/crds must link to crds/, not copy it"
    assert link.resolve() == SOURCE.resolve()


def test_rendered_crds_equal_the_source() -> None:
    source = source_crds()
    rendered = rendered_crds()
    assert rendered.keys() == source.keys()
    for name, crd in source.items():
        assert rendered[name]["spec"] == crd["spec"], f"{name}: spec drifted from crds/"
        assert rendered[name]["apiVersion"] == crd["apiVersion"]
        metadata = rendered[name]["metadata"]
        for key in ("labels", "annotations"):
            assert crd["metadata"].get(key, {}).items() <= metadata.get(key, {}).items()
        assert metadata["annotations"]["helm.sh/resource-policy"] == "keep"
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "guardedcron"


def test_crd_switches() -> None:
    assert rendered_crds({"crds": {"enabled": False}}) == {}
    for crd in rendered_crds({"crds": {"keep": False}}).values():
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("package")
    result = helm(["package", str(CHART), "--destination", str(out)])
    assert result.code == 0, result.stderr
    (archive,) = out.glob("guardedcron-*.tgz")
    return archive


def test_packaged_chart_carries_byte_identical_crds(packaged: Path) -> None:
    sources = sorted(SOURCE.glob("*.yaml"))
    assert sources
    with tarfile.open(packaged) as archive:
        for source in sources:
            member = archive.extractfile(f"guardedcron/files/crds/{source.name}")
            assert member is not None, f"{source.name} missing from the packaged chart"
            assert member.read() == source.read_bytes(), f"{source.name} differs in the package"
