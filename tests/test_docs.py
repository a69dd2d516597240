"""The documentation site builds with `mkdocs build --strict`, API reference included."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    # --strict turns every warning (a broken link or anchor, a page missing from the nav, a
    # docstring mkdocstrings cannot parse) into a failed build.
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    return out


def test_every_page_is_built(site: Path) -> None:
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert "quickstart" in pages and "api" in pages
    for page in pages:
        html = site / "index.html" if page == "index" else site / page / "index.html"
        assert html.is_file(), page


def test_api_reference_is_generated_from_docstrings(site: Path) -> None:
    text = re.sub(r"<[^>]+>", "", (site / "api" / "index.html").read_text())
    # Sentences from the docstrings of resume(), CheckpointCallback and RunStorage.
    assert "Continue the run in" in text
    assert "Save resumable checkpoints of a Keras model to a run folder" in text
    assert "A run folder of checkpoints behind any fsspec URL" in text


def test_readme_links_the_docs_and_the_notebook() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "examples/colab_resume.ipynb" in readme
    assert (ROOT / "examples" / "colab_resume.ipynb").is_file()
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
