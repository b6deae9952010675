"README.md is generated from nbs/index.ipynb and gives the same test command CI runs."
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.newest_triton_only   # text only: not run again on another Triton (.ci/run)


def test_readme_gives_the_commands_ci_runs():
    "CI runs the README's set-up and commands word for word: each of them, as .ci/run spells it, is in the README."
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in ("VENV_COMMAND", "CPU_TORCH_COMMAND", "FIRST_COMMAND", "TEST_COMMAND"):
        command = re.search(rf"^{name}='(.+)'$", ci, re.M)[1]
        assert f"```sh\n{command}\n```" in readme, (name, command)
        assert f'eval "${name}"' in ci, name                    # and CI runs it
    assert readme.index("CPU build") < readme.index("pip install torch==") < readme.index('pip install -e ".[bench]"')


def test_readme_gives_main_command():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[bench]" && python -m triton_fa2.bench --quick' in readme
    assert "python -m triton_fa2`" in readme                  # the smaller check is still named


def test_ci_pins_nothing_the_readme_does_not_say():
    "A version CI installs must be one the README gives the user, or one pyproject.toml declares."
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for pin in re.findall(r"(?:torch|triton|numpy)==[0-9.]+", ci):
        assert pin in readme or pin.startswith("triton=="), pin   # the Tritons CI compiles on are the supported ones
    assert re.search(r'"triton>=3\.6"', (ROOT / "pyproject.toml").read_text())


def test_readme_is_generated_from_index():
    import nbformat
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("<!-- Generated from nbs/index.ipynb")
    index = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    for cell in index.cells:  # every heading of the index notebook appears in the README
        for heading in re.findall(r"^#+ (.+)$", cell.source, re.M) if cell.cell_type == "markdown" else []:
            assert heading in readme, heading
