"""The runtime's shape, as docs/architecture.md describes it, held by checks that can fail.

* the import contracts of ``.importlinter`` (the runtime imports neither the harness nor Dagster, the
  per-key rules neither Spark nor the lake, no cycle among packages and modules) hold, and a
  broken contract is reported;
* an import inside a function says why it is there (a comment on the block), since every other
  import belongs at the top of its module;
* every ``docs/architecture.md#...`` reference in the code names a heading of that page, and the
  code cites no document outside the repository.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "ingest"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
REFERENCE = re.compile(r"docs/architecture\.md#([a-z0-9-]+)")


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300)


def test_the_import_contracts_hold() -> None:
    done = _lint(ROOT / ".importlinter")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.count(" KEPT") == 3


def test_a_broken_contract_is_reported(tmp_path: Path) -> None:
    """The checker does look: the journey does import the writers, so forbidding it must fail."""
    config = tmp_path / "contracts.ini"
    config.write_text("[importlinter]\nroot_packages =\n    ingest\n\n[importlinter:contract:x]\nname = x\n"
                      "type = forbidden\nsource_modules =\n    ingest.apply.journey\nforbidden_modules =\n"
                      "    ingest.commit\n")
    done = _lint(config)
    assert done.returncode != 0 and "BROKEN" in done.stdout


def namespace_packages(root: Path) -> list[str]:
    """Folders of Python modules under ``root`` without an ``__init__.py``: the import contracts do not
    see such a folder as a package, so a cycle through it goes unreported."""
    return sorted(str(d.relative_to(root.parent)) for d in [root, *root.rglob("*")]
                  if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
                  and not (d / "__init__.py").exists())


def test_every_folder_of_the_runtime_is_a_package_the_contracts_see() -> None:
    assert namespace_packages(RUNTIME) == []


def test_a_folder_without_its_init_is_found(tmp_path: Path) -> None:
    (tmp_path / "ingest" / "verify").mkdir(parents=True)
    (tmp_path / "ingest" / "__init__.py").write_text("")
    (tmp_path / "ingest" / "verify" / "source_db.py").write_text("")
    assert namespace_packages(tmp_path / "ingest") == ["ingest/verify"]


def unexplained_function_imports(path: Path) -> list[int]:
    """Lines of import statements inside functions (in any block of theirs: ``if``, ``try``, ``with``)
    that no comment explains: the first import of a run of imports needs a comment on its line or on
    the line before it, or, first in a block, on the line before the block's statement (``try:``)."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    found: list[int] = []

    def blocks(node: ast.AST) -> list[list[ast.stmt]]:
        names = ("body", "orelse", "finalbody")
        out = [getattr(node, name) for name in names if isinstance(getattr(node, name, None), list)]
        out += [handler.body for handler in getattr(node, "handlers", [])]
        return out

    def commented(lineno: int) -> bool:
        return "#" in lines[lineno - 1] or lines[lineno - 2].strip().startswith("#")

    def visit(body: list[ast.stmt], explained_above: bool = False) -> None:
        previous: ast.stmt | None = None
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                starts_run = not isinstance(previous, ast.Import | ast.ImportFrom)
                explained = commented(node.lineno) or (previous is None and explained_above)
                if starts_run and not explained:
                    found.append(node.lineno)
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                for block in blocks(node):
                    visit(block, commented(node.lineno))
            previous = node

    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            visit(func.body)
    return sorted(found)


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_an_import_inside_a_function_says_why(path: Path) -> None:
    assert unexplained_function_imports(path) == []


def test_the_check_finds_an_unexplained_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n    return json\n\n\ndef g():\n    # costly: only when g runs\n"
                      "    import csv\n    import io\n    return csv, io\n\n\ndef h(x):\n    if x:\n"
                      "        import os\n        return os\n")
    assert unexplained_function_imports(module) == [2, 15]


def _anchors() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return {re.sub(r"[^a-z0-9 -]", "", h.strip("# ").lower()).replace(" ", "-")
            for h in text.splitlines() if h.startswith("#")}


def test_every_reference_to_the_architecture_names_one_of_its_headings() -> None:
    anchors = _anchors()
    cited = {}
    for path in [*RUNTIME.rglob("*.py"), *(ROOT / "harness").rglob("*.py"), ROOT / "README.md"]:
        for anchor in REFERENCE.findall(path.read_text()):
            cited.setdefault(anchor, path)
    assert cited, "the code refers to the architecture somewhere"
    missing = {a: str(p.relative_to(ROOT)) for a, p in cited.items() if a not in anchors}
    assert missing == {}


def test_the_code_cites_no_document_outside_the_repository() -> None:
    outside = re.compile(r"DESIGN(\.md)? ?\d")
    cited = [str(p.relative_to(ROOT)) for p in [*RUNTIME.rglob("*.py"), *(ROOT / "harness").rglob("*.py"),
                                                  *(ROOT / "assets").rglob("*.py")]
             if outside.search(p.read_text())]
    assert cited == []
