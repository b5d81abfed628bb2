"""README.md's Python snippets, and which names each uses without defining: shared by the CPU test (every
snippet defines what it uses) and the GPU test (the snippets that run on one GPU, run as written)."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def undefined_names(code: str) -> set[str]:
    """Names a snippet reads that nothing in it binds (imports, assignments, loop and with targets,
    function and class names, their arguments, comprehension variables) and that are not builtins."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def runs_on_one_gpu(code: str) -> bool:
    """Whether a snippet runs as written in one process on one GPU (not under torchrun, not in an engine)."""
    return "init_process_group" not in code and "vllm" not in code and "sglang" not in code
