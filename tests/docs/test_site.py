"""The documentation site builds in strict mode, and a broken link or anchor fails the build.

``make test`` runs this, so CI builds the site the way ``make docs`` does (into a temporary
directory here): a page that links to a missing page or heading, a page left out of the navigation,
or a quoted repository file that is gone fails the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the checkout at ``root`` into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=root, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, check=False,
        timeout=300)


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert {"index.html", "reference/configuration/index.html", "benchmarks/index.html",
            "architecture/index.html", "getting-started/index.html"} <= built


def _copy_of_the_docs(tmp_path: Path) -> Path:
    """What the build reads -- mkdocs.yml, docs/, and the files pages quote -- in a scratch checkout."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for tree in ("docs", "configs", "scripts"):
        shutil.copytree(ROOT / tree, copy / tree, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize("link", ["[gone](no-such-page.md)", "[gone](concepts.md#no-such-heading)",
                                  "[gone](#no-such-heading-here)"])
def test_a_broken_link_fails_the_build(tmp_path: Path, link: str) -> None:
    copy = _copy_of_the_docs(tmp_path)
    page = copy / "docs" / "quality.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert link.split("(")[1].rstrip(")").split("#")[-1] in done.stdout + done.stderr


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path: Path) -> None:
    copy = _copy_of_the_docs(tmp_path)
    (copy / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stdout + done.stderr
