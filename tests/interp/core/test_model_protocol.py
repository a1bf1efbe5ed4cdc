"""`interp.HookedModel`, the protocol every analysis is typed against, names only what the hooked models have."""
import inspect

import pytest
import torch

import interp
from sprout import Sprout, SproutConfig, WalkthroughConfig, WalkthroughGPT


def members(protocol) -> set:
    own = {n for n in vars(protocol) if not n.startswith("_") or n == "__call__"}
    return (own | set(protocol.__annotations__)) - {"__annotations__"}


@pytest.mark.parametrize("make", [
    lambda: Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=16, d_ff=32)),
    lambda: WalkthroughGPT(WalkthroughConfig(vocab_size=64, context=16, d_model=16, n_head=2, n_layer=2, dropout=0.0)),
])
def test_the_hooked_models_have_every_member_of_the_protocol(make):
    model = make()
    names = members(interp.HookedModel)
    assert {"cfg", "hook_dict", "run_with_cache", "run_with_hooks", "W_U"} <= names
    for name in sorted(names):
        assert hasattr(model, name), name
        wanted = getattr(interp.HookedModel, name, None)
        if callable(wanted) and not isinstance(wanted, property):
            assert callable(getattr(model, name)), name
    assert isinstance(model.W_U, torch.Tensor) and model.W_U.shape[-1] == model.cfg.d_vocab


def test_every_public_analysis_types_its_model_argument():
    untyped = []
    for name in interp.__all__:
        fn = getattr(interp, name)
        if not inspect.isfunction(fn):
            continue
        params = inspect.signature(fn).parameters
        if "model" in params and params["model"].annotation is inspect.Parameter.empty:
            untyped.append(name)
    assert not untyped
