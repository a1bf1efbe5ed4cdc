"""The layering rules, read from the import graph (the AST of every module) and from the packaging.

sprout (the model) <- sprout.training; sprout <- interp <- figures / experiments; the `sprout` command
(sprout_cli) sits above sprout.training and interp. figures imports nothing of the project; nothing
imports experiments.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parent.parent
OURS = ("sprout", "interp", "figures", "experiments", "benchmarks", "sprout_cli", "tests")
PACKAGES = ("sprout", "interp", "figures", "experiments", "benchmarks", "sprout_cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if node.level == 0:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    prefix = ".".join(base + ([node.module] if node.module else []))
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` imports (absolute names; `from a import b` counts as a and a.b, since b may be a
    module), including `importlib.import_module("...")` / `__import__("...")` with a literal name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.update(_absolute(node, module, is_package))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                found.add(node.args[0].value)
    return {n for n in found if n.split(".")[0] in OURS}


def graph() -> dict[str, set[str]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = module_name(path)
            out[name] = imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
    return out


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        for dep in sorted(deps):
            why = None
            if within(dep, "experiments") and not within(mod, "experiments"):
                why = "nothing imports experiments"
            elif within(mod, "figures") and not within(dep, "figures"):
                why = "figures imports nothing of the project"
            elif within(mod, "interp") and (within(dep, "sprout.training") or dep.split(".")[0] not in ("interp", "sprout")):
                why = "interp imports sprout (not sprout.training) and itself only"
            elif within(mod, "sprout") and dep.split(".")[0] != "sprout":
                why = "sprout never imports interp, figures, experiments or the command line"
            elif within(mod, "benchmarks") and dep.split(".")[0] not in ("benchmarks", "sprout", "interp"):
                why = "benchmarks measure sprout and interp only"
            if why:
                bad.append(f"{mod} imports {dep}: {why}")
    return bad


def test_the_import_graph_follows_the_layers():
    g = graph()
    assert {"sprout", "sprout.model", "interp", "figures", "experiments.run_all", "sprout_cli"} <= set(g)
    assert violations(g) == []


@pytest.mark.parametrize("module,source,package,rule", [
    ("sprout.model", "from interp import heads", False, "sprout never imports"),
    ("sprout.cli", "import importlib\nimportlib.import_module('experiments.terminal')", False, "nothing imports experiments"),
    ("interp.heads", "from sprout.training.corpus import generate_corpus", False, "interp imports sprout"),
    ("interp.heads", "from sprout.training import corpus", False, "interp imports sprout"),
    ("figures.lens", "from interp import logit_lens", False, "figures imports nothing"),
    ("figures", "from .lens import grid\nfrom ..sprout import load", True, "figures imports nothing"),
    ("sprout.training.loop", "from ...interp import heads", False, "sprout never imports"),
])
def test_the_rule_reader_catches_each_kind_of_violation(module, source, package, rule):
    """The graph reader resolves relative imports and literal import_module calls (the old CLI's way)."""
    bad = violations({module: imports_of(source, module, package)})
    assert bad and all(rule in b for b in bad), bad


def test_allowed_imports_pass():
    g = {"interp.heads": imports_of("from sprout.synthetic import repeated_random_tokens\nfrom ._model import n_layers",
                                    "interp.heads"),
         "experiments.run_all": imports_of("from . import EXPERIMENTS\nimport interp, figures", "experiments.run_all"),
         "sprout_cli": imports_of("from sprout.training.cli import main\nfrom interp.cli import lens_main", "sprout_cli", True)}
    assert violations(g) == []


def test_import_sprout_imports_no_training_analysis_or_plotting_code():
    code = ("import sys, sprout; sprout.Sprout; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('interp', 'figures', 'experiments', 'plotly') "
            "or m.startswith('sprout.training')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dir_of_sprout_lists_load_and_save():
    import sprout

    assert {"load", "save", "keep_freed_memory"} <= set(dir(sprout)) and callable(sprout.load)


def test_installing_the_project_installs_no_experiments_or_benchmarks_package():
    """The wheel's packages are the library and the command: a user's own `experiments/` stays theirs."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]["find"]
    installed = find_namespace_packages(str(ROOT), include=cfg["include"], exclude=cfg.get("exclude", ()))
    tops = {p.split(".")[0] for p in installed}
    assert tops == {"sprout", "interp", "figures", "sprout_cli"}
    assert "sprout.training" in installed and "sprout.demo" in installed
    script = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["sprout"]
    assert script.split(":")[0] in installed


def module_edges() -> dict[str, set[str]]:
    """Each of our modules -> the modules of ours it imports: `from a import b` is a.b when b is a module,
    else a (a package's `__init__`); only modules that exist count."""
    paths = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    edges = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                prefix = _absolute(node, name, path.name == "__init__.py")[0]
                for a in node.names:
                    found.add(f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in paths else prefix)
        edges[name] = {d for d in found if d in paths and d != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph, one path each (Tarjan's strongly connected components)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_through_others():
    """No import circle anywhere, inside a package too (sprout.tokenizer <-> sprout.hf_tokenizer was one)."""
    assert cycles(module_edges()) == []


def test_the_cycle_finder_finds_a_circle_and_passes_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
