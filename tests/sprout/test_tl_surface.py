"""The models are assembled by composition: `HookedLM` holds its TransformerLens components as typed
attributes (`weights`, `hook_flags`, `codec`), which are plain objects outside the module tree, and every
TransformerLens name on the model hands over to one of them; no mixin is left in either model, nor in
their modules, which declare their weight names (`attn.W_Q`, `mlp.W_in`, `unembed.W_U`) as `ReadOnly`."""
import copy
import inspect
import pickle

import pytest
import torch
import torch.nn as nn
from transformer_lens.HookedRootModule import HookedRootModule

from sprout import walkthrough
from sprout.layers import MLPHooks, UnembedHooks
from sprout.model import GPT, Attention, Sprout, SproutTransformer
from sprout.tl.hook_flags import HookFlagRules
from sprout.tl.hooked import HookedLM
from sprout.tl.stacked_weights import StackedWeights
from sprout.tl.surface import ReadOnly
from sprout.tl.text_io import TextCodec
from sprout.tokenizer import char_tokenizer
from sprout.walkthrough import WalkthroughGPT, build_step
from tests.conftest import TINY, randomize_gains

MIXINS = {"TLWeights", "HookFlags", "TextIO"}
ATTN = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
MODULES = {Attention: ATTN, MLPHooks: ("W_in", "W_gate", "W_out", "b_in", "b_out"), UnembedHooks: ("W_U", "b_U"),
           walkthrough.Attention: ATTN, walkthrough.MLP: ("W_in", "W_out", "b_in", "b_out"), walkthrough.Unembed: ("W_U", "b_U")}


@pytest.fixture(params=["sprout", "walkthrough"])
def model(request):
    torch.manual_seed(0)
    if request.param == "sprout":
        return randomize_gains(Sprout(TINY, tokenizer=char_tokenizer("abcd ")).eval())
    return build_step("4.10", tokenizer=char_tokenizer("abcd ")).eval()


def test_the_models_inherit_no_mixin():
    assert Sprout.__bases__ == (SproutTransformer, HookedLM)
    assert WalkthroughGPT.__bases__ == (HookedLM,)
    assert HookedLM.__bases__ == (HookedRootModule,)
    for cls in (Sprout, WalkthroughGPT, GPT):
        assert not MIXINS & {c.__name__ for c in cls.__mro__}


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_the_modules_inherit_no_mixin_and_declare_their_weight_names(cls):
    assert set(cls.__mro__[1:]) <= {nn.Linear, nn.Module, object}
    for name in MODULES[cls]:
        declared = vars(cls)[name]
        assert isinstance(declared, ReadOnly) and declared.__doc__.startswith("["), name


def test_a_modules_weight_names_are_read_only(model):
    attn = model.blocks[0].attn
    before = attn.W_Q.clone()
    with pytest.raises(AttributeError, match="W_Q"):
        attn.W_Q = torch.zeros_like(before)
    assert torch.equal(attn.W_Q, before) and "W_Q" not in vars(attn)


def test_the_components_are_declared_and_outside_the_module_tree(model):
    assert (type(model.weights), type(model.hook_flags), type(model.codec)) == (StackedWeights, HookFlagRules, TextCodec)
    assert model.weights.model is model and model.hook_flags.model is model and model.codec.model is model
    assert not any(isinstance(c, nn.Module) for c in (model.weights, model.hook_flags, model.codec))
    names = {n for n, _ in model.named_modules()} | set(model.state_dict())
    assert not {n for n in names if n.split(".")[0] in ("weights", "hook_flags", "codec")}


def test_sprouts_state_dict_is_still_the_course_models():
    assert list(Sprout(TINY).state_dict()) == list(GPT(TINY).state_dict())


def test_the_weight_names_are_read_only(model):
    before = model.W_Q.clone()
    with pytest.raises(AttributeError, match="read-only"):
        model.W_Q = torch.zeros_like(before)
    with pytest.raises(AttributeError):
        model.QK = None
    with pytest.raises((AttributeError, KeyError)):  # nn.Module's register_parameter: the name is taken
        model.W_U = nn.Parameter(torch.zeros(1))
    assert torch.equal(model.W_Q, before) and "W_Q" not in vars(model)


def test_each_name_reads_its_component(model):
    assert torch.equal(model.W_Q, model.weights.stack("attn", "W_Q"))
    assert torch.equal(model.W_Q[0], model.blocks[0].attn.W_Q)
    assert model.tl_parameters().keys() == model.weights.tl_parameters().keys()
    assert torch.equal(model.to_tokens("abc"), model.codec.to_tokens("abc"))
    assert model.tokenizer is model.codec.tokenizer is not None


def test_help_shows_the_same_docstrings_and_signatures():
    assert Sprout.W_Q.__doc__.startswith("[n_layers, n_heads, d_model, d_head]")
    assert Sprout.generate.__doc__ == TextCodec.generate.__doc__
    assert Sprout.set_use_split_qkv_input.__doc__ == HookFlagRules.set_use_split_qkv_input.__doc__
    model = Sprout(TINY)
    for name in ("to_tokens", "generate", "get_token_position", "set_use_attn_in"):
        component = {"set_use_attn_in": model.hook_flags}.get(name, model.codec)
        assert inspect.signature(getattr(model, name)) == inspect.signature(getattr(component, name)), name


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_copy_gets_components_of_its_own(model, clone):
    other = clone(model)
    assert other.weights.model is other and other.hook_flags.model is other and other.codec.model is other
    assert torch.equal(other.W_Q, model.W_Q) and other.to_string(other.to_tokens("ab")[0]) == "ab"
    other.set_use_split_qkv_input(True)
    assert not model.cfg.use_split_qkv_input and "blocks.0.attn.hook_q_input" not in model.hook_dict
