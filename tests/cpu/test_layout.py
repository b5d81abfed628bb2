"""The package's layout is its pipeline: every import (module-level and inside functions, read with `ast`)
points down the flow top level -> comm -> device -> backends -> jit, none forms a circle, and only the
chooser (fused_ar.backends) names a vendor folder. The top level is the public API, torch ops, CLI, demo,
bench and the engine integrations (adapters over the public API). Each module says what it owns."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fused_ar"

# Imported by every stage; they import nothing of the package but each other.
FOUNDATION = {"fused_ar._version", "fused_ar.errors", "fused_ar.env"}
# The stages, lowest first: a module may import its own stage, the foundation and the stages below.
STAGES = ("jit", "backends", "device", "comm")
VENDORS = ("fused_ar.backends.nvidia", "fused_ar.backends.amd")
CHOOSER = "fused_ar.backends"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or
                                         (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports, anywhere in its body (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text(), str(path))
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(sub) for node in ast.walk(tree) if _type_checking(node) for stmt in node.body for sub in ast.walk(stmt)}

    def resolve(target: str) -> Optional[str]:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # `from package import module` names the module; `from module import name` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "fused_ar":
                module = resolve(target)
                if module and module != name:
                    found.add(module)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def stage(name: str) -> Optional[int]:
    """The stage index of a module, None for the top level (the public API, torch ops, CLI, demo, bench)."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return STAGES.index(parts[1])
    return None


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in edges.items():
        for dst in targets:
            if src in FOUNDATION:
                if dst not in FOUNDATION:
                    bad.append(f"{src} -> {dst}: the foundation imports nothing above it")
                continue
            if dst in FOUNDATION:
                continue
            s, d = stage(src), stage(dst)
            if d is None and dst != "fused_ar" and s is not None:
                bad.append(f"{src} -> {dst}: a stage imports the top level")
            elif s is not None and d is not None and d > s:
                bad.append(f"{src} -> {dst}: {STAGES[s]}/ imports {STAGES[d]}/, which is above it")
            if dst == "fused_ar" and src != "fused_ar.__main__":
                bad.append(f"{src} -> fused_ar: the package's lazy namespace is for users, not for its modules")
            if dst.startswith(VENDORS) and src != CHOOSER:
                vendor = next(v for v in VENDORS if dst.startswith(v))
                if not src.startswith(vendor):
                    bad.append(f"{src} -> {dst}: only {CHOOSER} picks a vendor")
    return sorted(bad)


def test_the_package_has_no_import_circles():
    assert circles(graph()) == []


def test_imports_point_down_the_flow_and_only_the_chooser_names_a_vendor():
    assert layer_violations(graph()) == []


def test_the_stages_are_folders():
    for folder in ("jit", "backends", "backends/nvidia", "backends/amd", "device", "comm"):
        assert (PACKAGE / folder / "__init__.py").is_file(), folder


def test_the_checks_catch_what_they_are_for():
    """The rules above fail on a circle, an upward import and a vendor named outside the chooser."""
    edges = {"fused_ar.jit.a": {"fused_ar.jit.b"}, "fused_ar.jit.b": {"fused_ar.jit.a"}}
    assert circles(edges) == [["fused_ar.jit.a", "fused_ar.jit.b"]]
    up = layer_violations({"fused_ar.jit.cache": {"fused_ar.backends"}})
    assert up and "jit/ imports backends/" in up[0]
    vendor = layer_violations({"fused_ar.device.launch": {"fused_ar.backends.nvidia.runtime"}})
    assert vendor and "only fused_ar.backends picks a vendor" in vendor[0]
    top = layer_violations({"fused_ar.comm.communicator": {"fused_ar.torch_ops"}})
    assert top and "a stage imports the top level" in top[0]


def test_a_function_level_import_counts(tmp_path):
    """An import inside a function is an edge like any other."""
    pkg = tmp_path / "fused_ar"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "a.py").write_text("def f():\n    from . import b\n    return b\n")
    (pkg / "jit" / "b.py").write_text("from .a import f\n")
    known = modules(pkg)
    edges = {name: imports(name, path, known) for name, path in known.items()}
    assert circles(edges) == [["fused_ar.jit.a", "fused_ar.jit.b"]]


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_says_what_it_owns(name):
    path = modules()[name]
    if name.endswith("__main__") or name == "fused_ar._version":
        return
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc.split()) >= 8, f"{path} opens with no docstring saying what it owns"
