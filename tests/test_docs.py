"The offline docs render: one HTML page per notebook, each with every figure its notebook holds."
import re, subprocess, sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "nbs").glob("*.ipynb"))


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "render_docs.py"), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"render_docs.py failed:\n{run.stderr[-3000:]}"
    return out


def figures(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_every_notebook_has_outputs_committed():
    # notebooks are committed executed; a code notebook with no outputs at all was saved before running
    for nb in NOTEBOOKS:
        cells = [c for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code"]
        assert any(c.outputs for c in cells) or nb.stem == "index", f"{nb.name} has no outputs"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_page_exists_with_its_figures(docs, nb):
    page = docs / (re.sub(r"^\d+_", "", nb.stem) + ".html")  # nbdev's page name: 00_naive -> naive.html
    assert page.exists(), f"no page for {nb.name}"
    html = page.read_text()
    assert html.count("data:image/png;base64") >= figures(nb)
    assert not re.search(r'href="\w+\.ipynb"', html)  # links between chapters point at pages, not notebooks


def test_chapters_have_a_figure():
    for nb in NOTEBOOKS:
        if nb.stem[:2].isdigit() and int(nb.stem[:2]) < 90:
            assert figures(nb) >= 1, f"{nb.name} has no plot"
