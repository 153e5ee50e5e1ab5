"""What users read speaks of the package, not of how it was built: no references to files outside the
repository and no project-history words, in the code, the docs, the notebooks (sources) and the model cards."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"\.\./shared|shared/(seeds|DESIGN|CLAIMS)|\bissues?\b|\bsessions?\b|\binvariant \d",
                       re.IGNORECASE)


def user_texts():
    for path in sorted((ROOT / "specdec_lite").rglob("*.py")):
        yield path, path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "data" / "drafts").glob("*/README.md"))]:
        if path.exists():
            yield path, path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(c["source"]) for c in cells)


def test_the_pattern_catches_what_it_should():
    for bad in ["see ../shared/CLAIMS.md", "the issue's goals", "this session", "invariant 4"]:
        assert FORBIDDEN.search(bad), bad
    assert not FORBIDDEN.search("the target's hidden states; an obsession with tissues")


def test_no_project_history_or_outside_references():
    found = [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for path, text in user_texts()
             for m in FORBIDDEN.finditer(text)]
    assert not found, found
