"""TransformerLens 4.3's `tools.analysis.logit_lens` run on Sprout as written (issue 36, item 7): the final
norm and the unembedding compose as TransformerLens' folded convention expects (a gainless `ln_final`,
the gain in `W_U`), so its readout check passes and every layer's reading equals an independent
computation from the weights."""
import pytest
import torch
from transformer_lens.tools.analysis.logit_lens import logit_lens

from sprout import Sprout
from tests.conftest import TINY, randomize_gains


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def _by_hand(model, resid):
    """RMS-normalise, apply the final gain, multiply by the tied embedding: no module of the model's."""
    x = resid.double()
    x = x / (x.pow(2).mean(-1, keepdim=True) + model.norm.eps).sqrt()
    return (x * model.norm.weight.double()) @ model.head.weight.double().T


def test_ln_final_then_unembed_is_the_folded_pair(model):
    x = torch.randn(2, 5, TINY.d_model)
    normed = model.ln_final(x)
    assert torch.allclose(normed.pow(2).mean(-1), torch.ones(2, 5), atol=1e-4)  # gainless
    assert torch.allclose(model.unembed(normed), normed @ model.W_U + model.b_U)
    assert torch.allclose(model.unembed(normed).double(), _by_hand(model, x), atol=1e-4)


def test_transformer_lens_logit_lens_runs_and_reads_every_layer(model):
    ids = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(ids)
    result = logit_lens(model, ids, positions=None)
    values = result.readout.values  # [layers + 1, batch, pos, vocab]
    assert values.shape == (TINY.n_layer + 1, 2, 9, TINY.vocab_size)
    assert torch.allclose(values[-1], logits, atol=1e-4)
    for layer in range(TINY.n_layer):
        want = _by_hand(model, cache[f"blocks.{layer}.hook_resid_pre"])
        assert torch.allclose(values[layer].double(), want, atol=1e-4), layer


def test_the_forward_is_unchanged_bit_for_bit_and_final_norm_hooks_still_fire(model):
    ids = torch.randint(0, TINY.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
    plain = model(ids)
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n.startswith("ln_final") or n == "unembed.hook_out")
    assert torch.equal(cache["unembed.hook_out"], plain)
    assert torch.allclose(cache["ln_final.hook_normalized"] @ model.W_U, plain, atol=1e-4)


@pytest.fixture(scope="module")
def walkthrough():
    from sprout.walkthrough import WalkthroughConfig, WalkthroughGPT
    torch.manual_seed(0)
    gpt = WalkthroughGPT(WalkthroughConfig(vocab_size=64, context=16, d_model=32, n_head=2, n_layer=2, dropout=0.0)).eval()
    with torch.no_grad():  # a final LayerNorm whose gain and bias matter
        gpt.ln_final.weight.add_(torch.randn(32) * 0.5)
        gpt.ln_final.bias.add_(torch.randn(32) * 0.5)
    return gpt


def _walkthrough_by_hand(gpt, resid):
    """LayerNorm with the final gain and bias, then the head's weight and bias: no module of the model's."""
    x = resid.double()
    x = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + gpt.ln_final.eps).sqrt()
    x = x * gpt.ln_final.weight.double() + gpt.ln_final.bias.double()
    return x @ gpt.unembed.weight.double().T + gpt.unembed.bias.double()


def test_walkthrough_ln_final_then_unembed_is_the_folded_pair_and_logit_lens_runs(walkthrough):
    """The walkthrough GPT under the same convention (its final LayerNorm without gain and bias, which W_U and
    b_U carry): TransformerLens' logit_lens runs on it and reads every layer as computed by hand."""
    gpt = walkthrough
    x = torch.randn(2, 5, 32)
    normed = gpt.ln_final(x)
    assert torch.allclose(normed.mean(-1), torch.zeros(2, 5), atol=1e-5)
    assert torch.allclose(normed.pow(2).mean(-1), torch.ones(2, 5), atol=1e-3)  # no gain, no bias
    assert torch.allclose(gpt.unembed(normed).double(), _walkthrough_by_hand(gpt, x), atol=1e-4)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    logits, cache = gpt.run_with_cache(ids)
    values = logit_lens(gpt, ids, positions=None).readout.values
    assert values.shape == (3, 2, 9, 64) and torch.allclose(values[-1], logits, atol=1e-4)
    for layer in range(2):
        assert torch.allclose(values[layer].double(), _walkthrough_by_hand(gpt, cache[f"blocks.{layer}.hook_resid_pre"]),
                              atol=1e-4), layer


def test_walkthrough_forward_is_the_whole_layer_norm_and_its_hooks_still_act(walkthrough):
    gpt = walkthrough
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    plain = gpt(ids)
    _, cache = gpt.run_with_cache(ids)
    assert torch.allclose(plain.double(), _walkthrough_by_hand(gpt, cache["blocks.1.hook_resid_post"]), atol=1e-4)
    assert torch.allclose(cache["ln_final.hook_normalized"] @ gpt.W_U + gpt.b_U, plain, atol=1e-4)
    doubled = gpt.run_with_hooks(ids, fwd_hooks=[("ln_final.hook_normalized", lambda t, hook: 2 * t)])
    assert torch.allclose(doubled, (2 * cache["ln_final.hook_normalized"]) @ gpt.W_U + gpt.b_U, atol=1e-4)
