"""Every public function and method of the covered modules annotates all its parameters and its return.

Read from the source with `ast` (no import of the packages, so it runs in well under a second and sees the
annotations as written). Public means a module-level function, or a method of a public class (nested classes
included), whose name does not start with "_", plus `__init__`; functions defined inside functions are not
public. `self` / `cls` (the first parameter of a method that is not a staticmethod) need no annotation;
`*args` / `**kwargs` are annotated like any other parameter. Tensor annotations carry their shapes with
jaxtyping (`Float[torch.Tensor, "batch pos d_model"]`), in TransformerLens' dimension names; this test only
checks that an annotation is there.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, NamedTuple, Union

ROOT = Path(__file__).resolve().parent.parent

# the library (sprout, interp) and the `sprout` command, entirely; figures, experiments and benchmarks are not covered yet
COVERED = ("interp", "sprout", "sprout_cli")

FunctionDef = Union[ast.FunctionDef, ast.AsyncFunctionDef]


class Public(NamedTuple):
    where: str  # file:line
    name: str  # Class.method or function
    params: list[tuple[str, bool]]  # (name, annotated), self / cls left out
    returns: bool


def covered_files() -> list[Path]:
    files: list[Path] = []
    for entry in COVERED:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def _is_public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _is_static(fn: FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _public(fn: FunctionDef, where: str, qualname: str, method: bool) -> Public:
    a = fn.args
    positional = a.posonlyargs + a.args
    if method and not _is_static(fn) and positional:
        positional = positional[1:]  # self / cls
    params = [(p.arg, p.annotation is not None) for p in positional + a.kwonlyargs]
    params += [(f"*{p.arg}", p.annotation is not None) for p in (a.vararg,) if p is not None]
    params += [(f"**{p.arg}", p.annotation is not None) for p in (a.kwarg,) if p is not None]
    return Public(where, qualname, params, fn.returns is not None)


def _walk(body: list[ast.stmt], path: str, prefix: str, method: bool) -> Iterator[Public]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(node.name):
            yield _public(node, f"{path}:{node.lineno}", prefix + node.name, method)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from _walk(node.body, path, f"{prefix}{node.name}.", True)
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` / version branches at module or class level
            yield from _walk(node.body + node.orelse, path, prefix, method)


def public_functions(file: Path) -> list[Public]:
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    return list(_walk(tree.body, str(file.relative_to(ROOT)), "", False))


def test_covered_paths_exist():
    missing = [entry for entry in COVERED if not (ROOT / entry).exists()]
    assert not missing, f"COVERED names paths that do not exist: {missing}"


def test_public_functions_are_annotated():
    offenders = []
    for file in covered_files():
        for fn in public_functions(file):
            missing = [name for name, annotated in fn.params if not annotated]
            if not fn.returns:
                missing.append("return")
            if missing:
                offenders.append(f"{fn.where}: {fn.name}: {', '.join(missing)}")
    assert not offenders, (f"{len(offenders)} public functions lack annotations (parameters, or the return):\n"
                           + "\n".join(offenders))
