"""The generated pages are current: the configuration reference (from ingest/config/) and the
benchmarks page (from benchmarks/results/). Each fails when its page differs from its generator's
output, and says which script rewrites it."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gen_config_reference
import record
import render_results

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_current() -> None:
    assert gen_config_reference.PAGE.read_text() == gen_config_reference.render(), \
        "docs/reference/configuration.md is stale: run scripts/gen_config_reference.py"


def test_the_reference_has_every_key_of_every_model() -> None:
    page = gen_config_reference.PAGE.read_text()
    for section in gen_config_reference.SECTIONS:
        part = page.split(f"## `{section.key}`", 1)[1].split("\n## ", 1)[0]
        for name, field in section.model.model_fields.items():
            assert f"| `{field.alias or name}`" in part, f"{section.key}.{name}"
            assert gen_config_reference._cell(field.description or "") in part, f"{section.key}.{name}"


def test_every_model_of_the_configuration_has_a_section() -> None:
    from pydantic import BaseModel

    documented = {s.model for s in gen_config_reference.SECTIONS}
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [gen_config_reference.IngestConfig]
    while todo:
        model = todo.pop()
        seen.add(model)
        for field in model.model_fields.values():
            for kind in _types_in(field.annotation):
                if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in seen:
                    todo.append(kind)
    assert seen <= documented


def _types_in(annotation: object) -> list[object]:
    from typing import get_args

    return [annotation, *(t for a in get_args(annotation) for t in _types_in(a))]


def test_a_stale_reference_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(gen_config_reference.render().replace("Spark master URL", "an older description"))
    monkeypatch.setattr(gen_config_reference, "PAGE", stale)
    monkeypatch.setattr(sys, "argv", ["gen_config_reference.py", "--check"])
    with pytest.raises(SystemExit) as stopped:
        gen_config_reference.main()
    assert "stale" in str(stopped.value)


def test_the_benchmarks_page_is_current() -> None:
    assert render_results.PAGE.read_text() == render_results.render(), \
        "docs/benchmarks.md is stale: run benchmarks/render_results.py"


def test_the_benchmarks_page_has_every_benchmark() -> None:
    page = render_results.PAGE.read_text()
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        assert f"## `{script.name}`" in page


def test_every_benchmark_writes_a_result_file() -> None:
    """A figure the code or a page cites must come from a result file, so no script only prints."""
    silent = [script.name for script in sorted((ROOT / "benchmarks").glob("bench_*.py"))
              if f"write_result({script.stem!r}" not in script.read_text()]
    assert not silent, f"these benchmarks print but write no result file (record.write_result): {silent}"


def test_a_result_file_holds_the_run_and_renders_on_the_page(tmp_path: Path) -> None:
    figures = [record.Figure("engine: wall time (batches)", 12.345, "s"), record.Figure("ratio engine/bare", 1.06),
               record.Figure("tables equal to the source", True), record.Figure("Spark JVM peak RSS", None, "MB")]
    path = record.write_result("bench_compare", {"format": "avro", "batch": 200000}, figures, results_dir=tmp_path,
                               argv=["benchmarks/bench_compare.py", "--format", "avro", "--batch", "200000"],
                               when=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert path.name == "bench_compare--batch-200000_format-avro.json"
    result = json.loads(path.read_text())
    assert result["date"] == "2026-01-02T03:04:05+00:00"
    assert len(result["commit"]["sha"]) == 40 and isinstance(result["commit"]["dirty"], bool)
    assert result["machine"]["cores"] >= 1 and result["machine"]["python"]
    assert result["command"] == "python benchmarks/bench_compare.py --format avro --batch 200000"
    page = render_results.render(tmp_path)
    section = page.split("## `bench_compare.py`", 1)[1].split("\n## ", 1)[0]
    assert "### `batch=200000`, `format=avro`" in section
    assert "2026-01-02T03:04:05+00:00" in section and result["commit"]["sha"][:10] in section
    assert "| engine: wall time (batches) | 12.35 s |" in section
    assert "| ratio engine/bare | 1.06 |" in section
    assert "| tables equal to the source | yes |" in section
    assert "| Spark JVM peak RSS | - |" in section
    assert "No result yet" not in section
    # the same variant run again replaces its file
    record.write_result("bench_compare", {"batch": 200000, "format": "avro"}, figures[:1], results_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_the_options_that_differ_name_the_variant() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--format", default="json")
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-work"))
    args = parser.parse_args(["--format", "avro", "--workdir", "/tmp/x"])
    assert record.changed_options(parser, args, ignore=("workdir",)) == {"format": "avro"}
    assert record.variant_slug({}) == "default"
    assert record.variant_slug({"spark_conf": [("a.b", "c")]}).startswith("spark-conf-")


def test_figures_of_several_cases_render_as_one_table_row_per_case(tmp_path: Path) -> None:
    figures = [record.Figure("one, run 1: p50", 2.49, "s"), record.Figure("one, run 1: steady", True),
               record.Figure("shop, run 1: p50", 2.6, "s"), record.Figure("shop, run 1: steady", False)]
    record.write_result("bench_latency", {}, figures, results_dir=tmp_path, argv=["benchmarks/bench_latency.py"])
    section = render_results.render(tmp_path).split("## `bench_latency.py`", 1)[1].split("\n## ", 1)[0]
    assert "| case | p50 | steady |\n|---|---|---|\n| one, run 1 | 2.49 s | yes |\n| shop, run 1 | 2.60 s | no |" \
        in section
