"""The layering rules, read from the import graph (the AST of every module) and from the packaging.

sprout (the model) <- sprout.training; sprout <- interp <- figures / experiments; the `sprout` command
(sprout_cli) sits above sprout.training and interp. figures imports nothing of the project; nothing
imports experiments. Inside the packages: no import circle among module-level imports (a module that
imports `a.b.c` also runs the packages `a.b` and `a` it is not part of), the probe material
(sprout.material) imports nothing of the model or its files, and no module imports another package's
private (`_name`) names or modules. interp is in rooms (interp.lens, interp.heads, ...; the last part of
this file): another room is reached through its `__all__` only, no private name crosses a room, the private
core imports no room, and no circle runs between rooms.
"""
import ast
import importlib
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


def sources() -> dict[str, tuple[str, bool]]:
    """{module: (source, is_package)} for every module of ours."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(path)] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return out


def graph() -> dict[str, set[str]]:
    return {name: imports_of(src, name, is_pkg) for name, (src, is_pkg) in sources().items()}


# the trainers' shared core (gradient reduction, clipping, resume check): interp's trainers import it
TRAINER_CORE = "sprout.training.core"


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
            elif within(mod, "interp") and ((within(dep, "sprout.training") and not within(dep, TRAINER_CORE))
                                            or dep.split(".")[0] not in ("interp", "sprout")):
                why = "interp imports sprout (not sprout.training, but for its trainer core) and itself only"
            elif within(mod, "sprout") and dep.split(".")[0] != "sprout":
                why = "sprout never imports interp, figures, experiments or the command line"
            elif within(mod, "benchmarks") and dep.split(".")[0] not in ("benchmarks", "sprout", "interp"):
                why = "benchmarks measure sprout and interp only"
            if why:
                bad.append(f"{mod} imports {dep}: {why}")
    return bad


# --- module-level imports: circles, the material package, private names ----------------------------------

def _top_level(tree: ast.Module):
    """The import statements that run when the module is imported: at module level, in if/try/with blocks
    and class bodies, not in functions, and not under `if TYPE_CHECKING:`."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                todo += node.body + node.orelse
        elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
            todo += node.body + [n for h in getattr(node, "handlers", ()) for n in h.body]
            todo += getattr(node, "orelse", []) + getattr(node, "finalbody", [])


def _ran_by(target: str, module: str) -> set[str]:
    """What importing `target` from `module` runs: target and the packages above it that `module` is not in
    (those are already running when `module` runs)."""
    parts = target.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if not within(module, p)}


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def load_graph(srcs: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{module: the modules of ours that importing it runs directly}: `from a import b` is the module a.b when
    there is one, else a."""
    out = {}
    for name, (src, is_pkg) in srcs.items():
        deps = set()
        for node in _top_level(ast.parse(src)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _resolve(node, name, is_pkg)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in srcs else base for a in node.names]
            for t in targets:
                deps |= _ran_by(t, name)
        out[name] = {d for d in deps if d in srcs and d != name}
    return out


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(found)


MATERIAL = "sprout.material"
MODEL_SIDE = ("sprout.model", "sprout.tl", "sprout.files", "sprout.walkthrough", "sprout.hooked", "sprout.training")


def material_reaches(g: dict[str, set[str]]) -> list[str]:
    """The model-side modules that importing the material package runs (it must run none)."""
    seen, todo = set(), [m for m in g if within(m, MATERIAL)]
    while todo:
        for dep in g.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(m for m in seen if not within(m, MATERIAL) and m.split(".")[0] == "sprout"
                  and (m == "sprout" or any(within(m, side) for side in MODEL_SIDE)))


def _package_of(module: str, srcs) -> str:
    return module if srcs.get(module, ("", False))[1] else module.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def every_import(srcs: dict[str, tuple[str, bool]]):
    """(importer, target module, imported name or None) for every import statement, in functions too:
    `from a import b` is the module a.b when there is one (name None), else a with name b."""
    for name, (src, is_pkg) in srcs.items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, is_pkg)
                pairs = [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in srcs else (base, a.name) for a in node.names]
            else:
                continue
            for target, attr in pairs:
                yield name, target, attr


def private_imports(srcs: dict[str, tuple[str, bool]]) -> list[str]:
    """`from X import _name` with X in another package than the importer, and imports of a private module
    (`pkg._mod`) from outside pkg; every import counts, in functions too."""
    bad = []
    for name, target, attr in every_import(srcs):
        if target.split(".")[0] not in OURS:
            continue
        is_pkg = srcs[name][1]
        mine = name if is_pkg else name.rpartition(".")[0]
        parts = target.split(".")
        hidden = [".".join(parts[:i]) for i in range(1, len(parts)) if _private(parts[i])]
        if any(not within(name, pkg) for pkg in hidden):
            bad.append(f"{name} imports the private module {target}")
        elif attr is not None and _private(attr) and _package_of(target, srcs) != mine:
            bad.append(f"{name} imports {target}.{attr}, a private name of another package")
    return sorted(set(bad))


LOOKED_AT = ("sprout", "interp", "figures", "experiments")


def test_no_import_circles():
    srcs = {m: v for m, v in sources().items() if m.split(".")[0] in LOOKED_AT}
    assert circles(load_graph(srcs)) == []


def test_the_material_package_runs_nothing_of_the_model():
    g = load_graph(sources())
    assert {m for m in g if within(m, MATERIAL)} >= {MATERIAL, f"{MATERIAL}.stories"}
    assert material_reaches(g) == []


def test_no_private_names_cross_a_package():
    srcs = {m: v for m, v in sources().items() if m.split(".")[0] in LOOKED_AT}
    assert private_imports(srcs) == []


def test_the_circle_finder_sees_circles_through_a_package_init_and_not_in_functions():
    srcs = {"a": ("from .b import f", True), "a.b": ("from a.c import g\ndef f(): pass", False),
            "a.c": ("import a.d\ndef g():\n    from a import b", False), "a.d": ("from .b import f", False),
            "p": ("from .q import x", True), "p.q": ("x = 1", False), "r": ("from p.q import x", False)}
    assert circles(load_graph(srcs)) == [["a.b", "a.c", "a.d"]]
    srcs["a.d"] = ("", False)
    srcs["p.q"] = ("from r import y\nx = 1", False)  # r runs p (p/__init__ imports p.q): a real circle
    assert circles(load_graph(srcs)) == [["p", "p.q", "r"]]


def test_the_material_check_follows_imports_through_other_modules():
    srcs = {"sprout": ("from .model import M", True), "sprout.model": ("M = 1", False),
            "sprout.material": ("from .stories import s", True), "sprout.material.stories": ("import sprout.names", False),
            "sprout.names": ("", False)}
    assert material_reaches(load_graph(srcs)) == []
    srcs["sprout.names"] = ("from sprout.files.checkpoint import load", False)
    srcs["sprout.files"], srcs["sprout.files.checkpoint"] = ("", True), ("from ..model import M", False)
    assert material_reaches(load_graph(srcs)) == ["sprout.files", "sprout.files.checkpoint", "sprout.model"]


@pytest.mark.parametrize("module,source,package,found", [
    ("experiments.demo_table", "from sprout.material import _CODAS", False, "private name of another package"),
    ("sprout.training.loop", "from ..tokenizer import _as_int", False, "private name of another package"),
    ("interp.heads", "def f():\n    from sprout.model import _rope", False, "private name of another package"),
    ("interp.rope", "import sprout._malloc", False, "private module"),
    ("interp.heads", "from ._model import n_layers\nfrom .lens import _unembed", False, None),
    ("interp.saes.train", "from .._model import n_layers\nfrom . import _util", False, None),
    ("sprout.material.stories", "from .names import _syllable_set", False, None),
])
def test_the_private_import_reader(module, source, package, found):
    srcs = {module: (source, package), "interp._model": ("", False), "interp.saes._util": ("", False),
            "interp.saes": ("", True), "interp": ("", True), "sprout": ("", True), "sprout._malloc": ("", False)}
    bad = [b for b in private_imports(srcs) if b.startswith(module + " ")]
    assert (bad == []) if found is None else (bad and all(found in b for b in bad)), bad


def test_the_import_graph_follows_the_layers():
    g = graph()
    assert {"sprout", "sprout.model", "interp", "figures", "experiments.run_all", "sprout_cli"} <= set(g)
    assert violations(g) == []


@pytest.mark.parametrize("module,source,package,rule", [
    ("sprout.model", "from interp import heads", False, "sprout never imports"),
    ("sprout.cli", "import importlib\nimportlib.import_module('experiments.terminal')", False, "nothing imports experiments"),
    ("interp.heads", "from sprout.training.corpus import generate_corpus", False, "interp imports sprout"),
    ("interp.heads", "from sprout.training import corpus", False, "interp imports sprout"),
    ("interp.lens.train", "from sprout.training.loop import train", False, "interp imports sprout"),
    ("figures.lens", "from interp import logit_lens", False, "figures imports nothing"),
    ("figures", "from .lens import grid\nfrom ..sprout import load", True, "figures imports nothing"),
    ("sprout.training.loop", "from ...interp import heads", False, "sprout never imports"),
])
def test_the_rule_reader_catches_each_kind_of_violation(module, source, package, rule):
    """The graph reader resolves relative imports and literal import_module calls (the old CLI's way)."""
    bad = violations({module: imports_of(source, module, package)})
    assert bad and all(rule in b for b in bad), bad


def test_allowed_imports_pass():
    g = {"interp.heads": imports_of("from sprout.material import repeated_random_tokens\nfrom ._model import n_layers",
                                    "interp.heads"),
         "experiments.run_all": imports_of("from . import EXPERIMENTS\nimport interp, figures", "experiments.run_all"),
         "sprout_cli": imports_of("from sprout.training.cli import main\nfrom interp.cli import lens_main", "sprout_cli", True),
         "interp.lens.train": imports_of("from sprout.training.core import clip_grads", "interp.lens.train")}
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


def test_no_module_imports_itself_through_others():
    """No import circle anywhere, inside a package too (sprout.tokenizer <-> sprout.hf_tokenizer was one)."""
    assert circles(module_edges()) == []


def test_the_cycle_finder_finds_a_circle_and_passes_a_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


# --- interp's rooms -----------------------------------------------------------------------------------
# interp is in rooms, one per question a user comes with: each child of interp (a subpackage such as
# interp.lens, or a module such as interp.data) is a room, and interp.saes.training is a room apart from
# interp.saes. interp._core is the private plumbing they share. A room reaches another only through that
# room's `__all__` (its public API); a subroom may use its parent's modules' public names; nothing imports
# a private name or module of another room; _core imports no room; no room imports interp's top or its
# command line; and no circle runs between rooms.

CORE = "interp._core"
SUBROOMS = ("interp.saes.training",)
EXPECTED_ROOMS = {CORE, "interp.data", "interp.lens", "interp.heads", "interp.patching", "interp.induction",
                  "interp.measures", "interp.saes", "interp.saes.training", "interp.graphs", "interp.discovery"}
CONSUMERS = ("interp", "interp.cli")  # the curated top and the command line: above every room


def room_of(module: str) -> str:
    """The room a module of interp is in: interp.X (or a subroom); interp itself is the top."""
    for sub in SUBROOMS:
        if within(module, sub):
            return sub
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def interp_imports(srcs: dict[str, tuple[str, bool]]):
    """`every_import` of interp by interp."""
    for name, target, attr in every_import(srcs):
        if within(name, "interp") and within(target, "interp"):
            yield name, target, attr


def room_violations(srcs: dict[str, tuple[str, bool]], exports: dict[str, set[str]]) -> list[str]:
    """What breaks the rooms' rules; `exports` is each room's `__all__`."""
    bad = []
    for mod, target, attr in interp_imports(srcs):
        mine, theirs = room_of(mod), room_of(target)
        if mine == theirs or mine in CONSUMERS and theirs == "interp" and target != "interp":
            continue
        parts = target.split(".")
        if theirs in CONSUMERS:
            bad.append(f"{mod} imports {target}: a room never imports interp's top or its command line")
        elif within(mod, CORE):
            bad.append(f"{mod} imports {target}: the core imports no room")
        elif any(_private(p) for p in parts[2:]) or attr is not None and _private(attr):
            bad.append(f"{mod} imports {target}{'.' + attr if attr else ''}: a private name of another room")
        elif theirs == CORE or any(within(mine, sub) and within(theirs, sub.rpartition(".")[0]) for sub in SUBROOMS):
            continue
        elif target.rpartition(".")[0] == theirs and attr is None and parts[-1] in exports.get(theirs, set()):
            continue  # a submodule the room exports by name (interp.discovery's `planted`)
        elif target != theirs or attr is None or attr not in exports.get(theirs, set()):
            bad.append(f"{mod} imports {target}{'.' + attr if attr else ''}: another room is reached through "
                       f"its __all__ only (from {theirs} import ...)")
    return sorted(set(bad))


def room_graph(srcs: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{room: the rooms it imports} (every import counts, in functions too)."""
    g: dict[str, set[str]] = {}
    for mod, target, _ in interp_imports(srcs):
        if room_of(mod) != room_of(target):
            g.setdefault(room_of(mod), set()).add(room_of(target))
    return g


def room_exports() -> dict[str, set[str]]:
    rooms = {room_of(m) for m in sources() if within(m, "interp")} - set(CONSUMERS) - {CORE}
    return {r: set(importlib.import_module(r).__all__) for r in rooms}


def test_interp_is_in_the_expected_rooms_each_with_an_all():
    srcs = sources()
    rooms = {room_of(m) for m in srcs if within(m, "interp")} - set(CONSUMERS)
    assert rooms >= EXPECTED_ROOMS
    assert all(e for e in room_exports().values())  # every room says what it offers


def test_rooms_reach_each_other_through_their_public_api_only():
    assert room_violations(sources(), room_exports()) == []


def test_no_circle_between_rooms_and_the_core_imports_no_room():
    g = room_graph(sources())
    assert circles(g) == []
    assert g.get(CORE, set()) == set()


def test_the_induction_room_is_built_from_the_other_rooms_public_names():
    """The chapter's study uses the other rooms as a user would (and the shared core)."""
    srcs = sources()
    exports = room_exports()
    for mod, target, attr in interp_imports(srcs):
        if within(mod, "interp.induction") and not within(target, "interp.induction") and not within(target, CORE):
            assert target in exports and attr in exports[target], f"{mod} imports {target}.{attr}"


@pytest.mark.parametrize("module,source,package,found", [
    ("interp.induction.circuit", "from ..heads.ablation import ablate_heads", False, "through its __all__"),
    ("interp.induction.circuit", "from ..heads import _loss", False, "private name of another room"),
    ("interp.heads.ablation", "from ..lens._loss import Scratch", False, "private name of another room"),
    ("interp.heads.ablation", "def f():\n    from ..lens import secret", False, "through its __all__"),
    ("interp._core.model", "from ..lens import logit_lens", False, "the core imports no room"),
    ("interp.lens.logit", "from .. import logit_lens", False, "never imports interp's top"),
    ("interp.lens.logit", "from ..cli import positive", False, "never imports interp's top"),
    ("interp.induction.circuit", "from ..heads import ablate_heads\nfrom .._core.model import n_layers", False, None),
    ("interp.lens.tuned", "from .logit import _lens_batches", False, None),
    ("interp.saes.training.train", "from ..files import hook_layer\nfrom ..sae import SAE", False, None),
    ("interp.saes.training.train", "from ..files import _read", False, "private name of another room"),
    ("interp", "from .lens import logit_lens\nfrom ._core.model import HookedModel", True, None),
])
def test_the_room_rule_reader(module, source, package, found):
    srcs = {"interp": ("", True), "interp._core": ("", True), "interp._core.model": ("", False),
            "interp.heads": ("", True), "interp.heads.ablation": ("", False), "interp.lens": ("", True),
            "interp.lens._loss": ("", False), "interp.lens.logit": ("", False), "interp.cli": ("", False),
            "interp.saes": ("", True), "interp.saes.files": ("", False), "interp.saes.sae": ("", False),
            "interp.saes.training": ("", True), module: (source, package)}
    exports = {"interp.heads": {"ablate_heads"}, "interp.lens": {"logit_lens"}}
    bad = [b for b in room_violations(srcs, exports) if b.startswith(module + " ")]
    assert (bad == []) if found is None else (bad and all(found in b for b in bad)), bad


def test_the_room_graph_finds_a_circle_between_rooms():
    srcs = {"interp.lens.tuned": ("from ..measures import unigram_log_probs", False),
            "interp.measures.loss": ("def f():\n    from ..lens import logit_lens", False),
            "interp.lens": ("", True), "interp.measures": ("", True)}
    assert circles(room_graph(srcs)) == [["interp.lens", "interp.measures"]]
