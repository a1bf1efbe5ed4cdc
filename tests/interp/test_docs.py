"""Every example in interp's docstrings runs and prints what it says."""
import doctest
import importlib

import pytest

MODULES = ["_core.inputs", "heads.ablation", "heads.attention", "heads.scores", "induction.stories", "lens.logit", "measures.loss",
           "measures.params", "measures.residual", "measures.rope", "lens.tuned"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"interp.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"interp.{name} has no examples"
    assert result.failed == 0
