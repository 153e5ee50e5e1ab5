"""Project set-up stays consistent: environment.yml and pyproject.toml list the same dependencies."""
import os
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


def test_ci_runs_the_readme_test_command():
    """.ci/run is an executable script whose one command, from the repository root, is `make test`, the command
    the README says CI runs. (The rest of the layout is read by other tests: environment.yml and pyproject.toml
    above, the Makefile below, README.md and docs in test_claims, notebooks in test_claims and test_notebook_files,
    data/ and figures/ in test_install and test_report.)"""
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK)
    commands = [line.strip() for line in script.read_text().splitlines()[1:]
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"]
    assert re.search(r"^make test .*\(CI runs this\)$", (ROOT / "README.md").read_text(), re.M)


def test_cpu_install_path_pins_torch():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_SPEC \?= torch==\d+\.\d+\.\d+$", makefile, re.M)
