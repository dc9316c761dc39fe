"""The pipeline as a Dagster component (issue 46, point 4): a dg project that adds two pipelines with
two ``defs.yaml`` files and no Python of its own loads, each pipeline with its own names; ``dg``
lists the component."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.dagster.conftest import write_config


def test_a_dg_project_adds_two_pipelines_with_defs_yaml_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "shopproj"
    (project / "shopproj" / "defs").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "shopproj"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "shopproj"\n')
    for package in (project / "shopproj", project / "shopproj" / "defs"):
        (package / "__init__.py").write_text("")
    for prefix in ("erp", "crm"):
        path, _ = write_config(tmp_path / "configs" / prefix, value_format="json",
                               tables=[{"name": "orders", "topic": f"{prefix}.public.orders"}])
        raw = yaml.safe_load(path.read_text())
        raw["dagster"] = {"prefix": prefix, "mode": "observe" if prefix == "crm" else "run"}
        path.write_text(yaml.safe_dump(raw))
        folder = project / "shopproj" / "defs" / prefix
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump({
            "type": "assets.component.CdcIngestPipeline",
            "attributes": {"config_path": str(Path("../../../../configs") / prefix / "config.yaml")}}))
    monkeypatch.syspath_prepend(str(project))
    try:
        defs = dg.load_from_defs_folder(path_within_project=project)
        dg.Definitions.validate_loadable(defs)
        graph = defs.get_repository_def().asset_graph
        assert graph.get_all_asset_keys() == {dg.AssetKey(["erp", "orders"]), dg.AssetKey(["crm", "orders"])}
        assert graph.materializable_asset_keys == {dg.AssetKey(["erp", "orders"])}  # crm observes a service
        assert {s.name for s in defs.sensors or []} == {"erp_offsets_sensor", "crm_audit_sensor"}  # type: ignore[union-attr]
        assert defs.resolve_job_def("erp_ingest_all_tables") is not None
    finally:
        for name in [m for m in sys.modules if m == "shopproj" or m.startswith("shopproj.")]:
            del sys.modules[name]


def test_dg_lists_the_component(tmp_path: Path) -> None:
    """Registered through the ``dagster_dg_cli.registry_modules`` entry point: ``dg`` offers it."""
    done = subprocess.run([str(Path(sys.executable).parent / "dg"), "list", "components", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = {item["key"] for item in json.loads(done.stdout)["items"]}
    assert "assets.component.CdcIngestPipeline" in keys
