"README.md is generated from nbs/index.ipynb and gives the same test command CI runs."
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_gives_ci_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^TEST_COMMAND='(.+)'$", ci, re.M)[1]
    assert command in (ROOT / "README.md").read_text()


def test_readme_gives_main_command():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e . && python -m triton_fa2.bench --quick" in readme
    assert "python -m triton_fa2`" in readme                  # the smaller check is still named


def test_readme_is_generated_from_index():
    import nbformat
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("<!-- Generated from nbs/index.ipynb")
    index = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    for cell in index.cells:  # every heading of the index notebook appears in the README
        for heading in re.findall(r"^#+ (.+)$", cell.source, re.M) if cell.cell_type == "markdown" else []:
            assert heading in readme, heading
