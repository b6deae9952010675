"""The offline docs render: one HTML page per notebook, each with every figure its notebook holds, a sidebar of every
page, math set by a local MathJax, local images embedded; and an API entry (`show_doc`) for every exported function."""
import ast, importlib.util, re, subprocess, sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "nbs").glob("*.ipynb"))


def page_of(nb):
    return re.sub(r"^\d+_", "", nb.stem) + ".html"  # nbdev's page name: 00_naive -> naive.html


# One worker renders the docs once for all of this module's tests (ONE_WORKER in tests/conftest.py), not one render a worker;
# the docs run no kernel: not rendered again on another Triton (.ci/run)
pytestmark = pytest.mark.newest_triton_only


@pytest.fixture(scope="module")
def fake_mathjax(tmp_path_factory):
    "A stand-in for the npm package's layout (CI has no npm): the renderer must copy it next to the pages."
    es5 = tmp_path_factory.mktemp("mathjax") / "node_modules" / "mathjax" / "es5"
    (es5 / "input" / "tex" / "extensions").mkdir(parents=True)
    (es5 / "tex-svg.js").write_text("/* stand-in for MathJax 3 */\n")
    (es5 / "input" / "tex" / "extensions" / "textmacros.js").write_text("/* stand-in */\n")
    return es5.parents[2]


@pytest.fixture(scope="module")
def docs(tmp_path_factory, fake_mathjax):
    out = tmp_path_factory.mktemp("docs")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "render_docs.py"), "--out", str(out), "--mathjax", str(fake_mathjax)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
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
    page = docs / page_of(nb)
    assert page.exists(), f"no page for {nb.name}"
    html = page.read_text()
    assert html.count("data:image/png;base64") >= figures(nb)
    assert not re.search(r'href="\w+\.ipynb"', html)  # links between chapters point at pages, not notebooks


def test_chapters_have_a_figure():
    for nb in NOTEBOOKS:
        if nb.stem[:2].isdigit() and int(nb.stem[:2]) < 90:
            assert figures(nb) >= 1, f"{nb.name} has no plot"


# --- the pages' structure: what a reader sees without a browser to check it ----------------------------------------

def test_sidebar_lists_every_page_in_chapter_order(docs):
    order = [page_of(nb) for nb in sorted(NOTEBOOKS, key=lambda p: (p.stem != "index", p.stem))]
    for nb in NOTEBOOKS:
        html = (docs / page_of(nb)).read_text()
        side = re.search(r'<nav class="fa2-sidebar".*?</nav>', html, re.S)
        assert side, f"{page_of(nb)} has no sidebar"
        test_links = re.findall(r'<li><a href="([\w-]+\.html)"', side[0])
        assert test_links == order, f"{page_of(nb)}: sidebar {test_links}"
        assert re.search(rf'<a href="{page_of(nb)}" class="fa2-current"', side[0]), f"{page_of(nb)}: current page not marked"
        assert "cdn" not in side[0].lower()


def test_long_pages_have_contents(docs):
    html = (docs / "tiling.html").read_text()
    toc = re.search(r'<nav class="fa2-toc".*?</nav>', html, re.S)
    assert toc, "tiling.html has no contents list"
    ids = re.findall(r'<h[23] id="([^"]+)"', html)
    targets = re.findall(r'<a href="#([^"]+)"', toc[0])
    assert targets and set(targets) <= set(ids) and len(targets) >= 3


def test_math_is_set_by_the_local_mathjax(docs, fake_mathjax):
    assert (docs / "mathjax" / "tex-svg.js").read_text() == "/* stand-in for MathJax 3 */\n"
    assert (docs / "mathjax" / "input" / "tex" / "extensions" / "textmacros.js").exists()
    for nb in NOTEBOOKS:
        html = (docs / page_of(nb)).read_text()
        assert '<script id="MathJax-script" defer src="mathjax/tex-svg.js"></script>' in html, page_of(nb)
        assert not re.search(r'<script[^>]+src="https?://[^"]*mathjax', html, re.I), f"{page_of(nb)} loads MathJax from the web"


def test_mathjax_falls_back_to_the_cdn(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "tools" / "render_docs.py")
    rd = importlib.util.module_from_spec(spec); spec.loader.exec_module(rd)
    monkeypatch.delenv(rd.MATHJAX_ENV, raising=False)
    monkeypatch.setattr(rd, "MATHJAX_DEFAULT", tmp_path / "nothing here")
    assert rd.find_mathjax() is None and rd.find_mathjax("cdn") is None
    assert f'src="{rd.MATHJAX_CDN}"' in rd.mathjax_head(rd.MATHJAX_CDN)
    with pytest.raises(SystemExit, match="npm install"): rd.find_mathjax(str(tmp_path))   # named, but empty
    monkeypatch.setenv(rd.MATHJAX_ENV, str(tmp_path / "nothing here"))
    with pytest.raises(SystemExit): rd.find_mathjax()


def test_local_images_are_embedded(docs):
    # a relative image link breaks wherever the pages are copied; the hero plot of the index is one
    for nb in NOTEBOOKS:
        html = (docs / page_of(nb)).read_text()
        local = [s for s in re.findall(r'<img\b[^>]*?\bsrc="([^"]*)"', html) if not re.match(r"(data:|https?://)", s)]
        assert not local, f"{page_of(nb)} links local images: {local}"
    index = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    if any("../results/hero.png" in c.source for c in index.cells if c.cell_type == "markdown"):
        assert (docs / "index.html").read_text().count("data:image/png;base64") >= 1


def test_links_to_the_site_stay_in_the_rendered_pages(docs):
    for nb in NOTEBOOKS:
        html = (docs / page_of(nb)).read_text()
        assert not re.search(r'href="https://[^"]*github\.io/[^"]*/[\w-]+\.html', html), f"{page_of(nb)} links the published site"


# --- API entries: every exported function and class gets a show_doc cell of its own ---------------------------------

EXPORT = re.compile(r"^#\|\s*exports?(\s|$)", re.M)


def _code(cell):
    "A cell's Python: its directive lines (`#| ...`) dropped."
    return "\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith("#|"))


def _is_patch(node):
    return any(getattr(d, "id", getattr(getattr(d, "func", None), "id", "")).startswith("patch") for d in node.decorator_list)


def exported_api(cells):
    """(cell index, name) of each public function and class an export cell defines: nbdev puts them in `__all__`.
    Public constants are in `__all__` too, but `show_doc` documents a value's type, not the value, so prose does."""
    for i, c in enumerate(cells):
        if c.cell_type != "code" or not EXPORT.search(c.source): continue
        for node in ast.parse(_code(c)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_") and not _is_patch(node):
                yield i, node.name


def show_doc_target(cell):
    "The name a cell's one `show_doc(name)` call documents, or None for any other cell."
    if cell.cell_type != "code": return None
    try: body = ast.parse(_code(cell)).body
    except SyntaxError: return None
    if len(body) != 1 or not isinstance(body[0], ast.Expr): return None
    call = body[0].value
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "show_doc" and call.args): return None
    sym = call.args[0]
    return sym.id if isinstance(sym, ast.Name) else getattr(sym, "attr", None)


def show_doc_problems(nb_path):
    "What is missing: each exported name without a show_doc cell of its own right after its cell, and crowded cells."
    cells = nbformat.read(nb_path, as_version=4).cells
    problems = []
    for i, c in enumerate(cells):
        if c.cell_type == "code" and len(re.findall(r"\bshow_doc\(", _code(c))) > 1:
            problems.append(f"{nb_path.name}: cell {i} holds {len(re.findall(r'show_doc[(]', _code(c)))} show_doc calls (one per cell)")
    for i, name in exported_api(cells):
        after, j = [], i + 1
        while j < len(cells) and show_doc_target(cells[j]) is not None:   # the run of show_doc cells after the export
            after.append(show_doc_target(cells[j])); j += 1
        if name in after: continue
        elsewhere = any(show_doc_target(c) == name for c in cells)
        problems.append(f"{nb_path.name}: {name}" + (" (its show_doc cell is not right after the exported cell)" if elsewhere else ""))
    return problems


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_export_has_its_own_show_doc(nb):
    problems = show_doc_problems(nb)
    assert not problems, "exported names without a show_doc cell of their own:\n" + "\n".join(problems)


def cells_testing_in_the_docs_build(nb_path) -> list:
    """Cells the docs build executes (nbdev's processing runs every cell that imports, besides the exported ones and the
    `show_doc` ones) that also test something: an `assert`, a loop or a `with` block, or a call to `test_*` or `check*`.
    A notebook with neither exports nor `show_doc` (the index) has nothing of its own executed."""
    found, cells = [], nbformat.read(nb_path, as_version=4).cells
    if not any(re.search(r"^#\|\s*export|show_doc\(", c.source, re.M) for c in cells if c.cell_type == "code"): return found
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or re.search(r"^#\|\s*(export|exporti|exports|eval:\s*false)", cell.source, re.M): continue
        try: tree = ast.parse("\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith(("%", "!"))))
        except SyntaxError: continue
        if not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree)): continue
        tests = [n for n in ast.walk(tree) if isinstance(n, (ast.Assert, ast.For, ast.With))
                 or isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id.startswith(("test_", "check"))]
        if tests: found.append(f"{nb_path.name} cell {i}: {cell.source.splitlines()[0][:80]}")
    return found


def test_the_docs_build_runs_no_test():
    "The setup cell imports; a test cell that imports too runs again, slowly, in every docs build (DEVELOPERS.md)."
    found = [f for nb in NOTEBOOKS for f in cells_testing_in_the_docs_build(nb)]
    assert not found, "move these cells' imports into the notebook's imports cell:\n" + "\n".join(found)
