"""Every example in interp's docstrings runs and prints what it says."""
import doctest
import importlib

import pytest

MODULES = ["_inputs", "ablation", "attention", "heads", "induction", "lens", "loss", "params", "residual", "rope", "tuned_lens"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"interp.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"interp.{name} has no examples"
    assert result.failed == 0
