"""README.md's snippets define every name they use (the GPU suite runs the ones that run on one GPU:
tests/gpu/test_user_commands_gpu.py)."""

from __future__ import annotations

import pytest

from tests.readme_snippets import snippets, undefined_names


def test_readme_has_snippets():
    assert len(snippets()) >= 5


@pytest.mark.parametrize("index", range(len(snippets())))
def test_every_snippet_defines_what_it_uses(index):
    code = snippets()[index]
    compile(code, f"README snippet {index}", "exec")
    assert undefined_names(code) == set(), code


def test_the_check_finds_an_undefined_name():
    assert undefined_names("import torch\ny = torch.ones(2) + x\n") == {"x"}
    assert undefined_names("for a, b in zip([], []):\n    print(a, b)\n") == set()
