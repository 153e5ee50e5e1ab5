"""Project set-up stays consistent: environment.yml and pyproject.toml list the same dependencies."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def test_environment_yml_matches_pyproject():
    """environment.yml installs the core dependencies and every extra (the notebooks, training and tests)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for name, deps in project["optional-dependencies"].items() if name != "all" for d in deps]
    pyproject = set(project["dependencies"]) | set(extras)
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pip_deps = [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")]
    pip_deps = [d for d in pip_deps if not d.startswith("-e")]
    assert sorted(map(normalise, pip_deps)) == sorted(map(normalise, pyproject))
    assert "- -e .[all]" in (ROOT / "environment.yml").read_text()


def test_layout_of_the_design_card():
    for name in ["notebooks", "specdec_lite", "data", "figures", "tests", "environment.yml", "README.md",
                 "pyproject.toml", "Makefile", ".ci/run"]:
        assert (ROOT / name).exists(), name


def test_cpu_install_path_pins_torch():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_SPEC \?= torch==\d+\.\d+\.\d+$", makefile, re.M)
