"""The package's shape: layers that import only downwards, no import cycles, a light top-level import, no
borrowed private names, data found through one module, clean command-line entry points."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_lite"
# each layer may import itself and the layers before it; sweep and serve are the top layer, side by side
LAYERS = ["paths", "names", "tokenizers", "show", "tuning", "core", "requests", "generate", "instruments", "drafts",
          "repro", "train", "sweep", "serve"]
TOP = {"sweep", "serve"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: dict) -> list[tuple[str, str]]:
    """(imported module, imported name or '') for every import of this package's modules in ``path``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("specdec_lite")]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(node, name, path.name == "__init__.py")
            if not target.startswith("specdec_lite"):
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((submodule, "") if submodule in known else (target, alias.name))
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for m, _ in imports_of(name, path, known) if m in known and m != name}
            for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index("sweep") if parts[1] in TOP else LAYERS.index(parts[1])


def test_top_modules_do_not_import_each_other():
    graph = import_graph()
    assert "specdec_lite.serve" in graph and "specdec_lite.serve" not in graph["specdec_lite.sweep"]
    assert "specdec_lite.sweep" not in graph["specdec_lite.serve"]


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 30 and graph["specdec_lite.core.decode"]  # the graph is really built
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_layers_import_only_downwards():
    wrong = [(a, b) for a, targets in import_graph().items() for b in targets
             if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert not wrong, wrong


def test_no_module_imports_another_modules_private_names():
    known = modules()
    borrowed = [(name, target, imported) for name, path in known.items()
                for target, imported in imports_of(name, path, known) if imported.startswith("_")]
    assert not borrowed, borrowed


def test_only_paths_knows_where_files_are():
    users = [name for name, path in modules().items() if "__file__" in path.read_text()]
    assert users == ["specdec_lite.paths"], users


def test_import_specdec_lite_is_light():
    code = ("import sys, specdec_lite; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pandas', 'scipy', 'seaborn', 'matplotlib', 'papermill', 'specdec_lite'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "specdec_lite.core.decode" in loaded  # the probe sees the package's modules
    heavy = [m for m in loaded if not m.startswith("specdec_lite")]
    assert not heavy, heavy
    extra = [m for m in loaded if m.startswith(("specdec_lite.train", "specdec_lite.repro"))]
    assert not extra, extra
    code = "import specdec_lite as sd; print(sd.theory.expected_tokens(0.5, 4), sd.MarkovLM.__name__)"
    on_first_use = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert on_first_use.split() == ["1.9375", "MarkovLM"]


def entry_points() -> list[str]:
    return [name for name, path in modules().items() if 'if __name__ == "__main__"' in path.read_text()]


def test_entry_points_are_the_documented_ones():
    assert set(entry_points()) == {"specdec_lite.repro.demo", "specdec_lite.repro.bench", "specdec_lite.repro.evaluate",
                                   "specdec_lite.repro.report", "specdec_lite.sweep", "specdec_lite.repro.gpu_bench",
                                   "specdec_lite.train.corpus", "specdec_lite.train.features", "specdec_lite.train.teacher",
                                   "specdec_lite.train.eagle3", "specdec_lite.train.continued", "specdec_lite.train.self_prompts",
                                   "specdec_lite.train.restore", "specdec_lite.train.gpu_train",
                                   "specdec_lite.serve", "specdec_lite.drafts.calibrate",
                                   "specdec_lite.repro.greedy_load"}


# runs each module named on its command line as `python -m module --help` runs it, one after another in this one
# interpreter (importing torch and transformers is most of each one's time), and prints what each did as JSON
HELP_RUNNER = """
import contextlib, io, json, runpy, sys, traceback
done = {}
for module in sys.argv[1:]:
    sys.modules.pop(module, None)  # imported by an earlier one: runpy would warn, an error under -W error
    sys.argv = [module, "--help"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code or 0
        except BaseException:
            code = 1
            traceback.print_exc()
    done[module] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(done))
"""


def test_entry_points_run_without_warnings():
    """Every entry point's --help exits 0 and prints its usage, with warnings turned into errors."""
    run = subprocess.run([sys.executable, "-W", "error", "-c", HELP_RUNNER, *sorted(entry_points())],
                         capture_output=True, text=True, check=True)
    done = json.loads(run.stdout)
    assert sorted(done) == sorted(entry_points())
    failed = {module: r["stderr"] for module, r in done.items()
              if r["code"] != 0 or "usage:" not in r["stdout"] or "Warning" in r["stderr"]}
    assert not failed, failed


SUBPACKAGES = ["tuning", "core", "instruments", "drafts", "repro", "train"]


def listed_modules(docstring: str) -> set[str]:
    """The module names a subpackage's docstring lists: lines indented by two spaces that start with one name or a
    comma-separated run of names, then two or more spaces and the description (deeper indents continue a line)."""
    listed = set()
    for line in docstring.splitlines():
        match = re.match(r"^  (\w+(?:, \w+)*)\s{2,}\S", line)
        if match:
            listed.update(match.group(1).split(", "))
    return listed


def test_listed_modules_reads_names_and_skips_continuations():
    doc = "Title.\n\n  a, b_c   what they do\n               a continuation, not names\n  d  one more\n"
    assert listed_modules(doc) == {"a", "b_c", "d"}


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_subpackage_docstring_lists_every_module(subpackage):
    folder = PACKAGE / subpackage
    actual = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    listed = listed_modules(ast.get_docstring(ast.parse((folder / "__init__.py").read_text()), clean=False) or "")
    assert listed == actual, f"{subpackage}/__init__.py lists {sorted(listed - actual)} that do not exist and " \
                             f"misses {sorted(actual - listed)}"


def test_only_paths_names_the_data_folders():
    """Every data path is built by ``paths``: no other module joins the checkout's "data" folder itself."""
    builders = [name for name, path in modules().items()
                if name != "specdec_lite.paths" and re.search(r'/ "data"|"data/', path.read_text())]
    assert builders == [], builders
