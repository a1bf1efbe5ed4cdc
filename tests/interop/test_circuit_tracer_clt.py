"""circuit-tracer's own cross-layer transcoder loader (`load_clt`) reads the folder `save_circuit_tracer` writes
for an `interp.CrossLayerTranscoder`, and the CLT it builds encodes, decodes and attributes as ours does (the
interop venv: `.ci/run` builds it).

The model is a tiny random Sprout of 3 blocks exported to Hugging Face, as in
`test_circuit_tracer_attribute.py`; the CLT is random, JumpReLU (the kind circuit-tracer reads), without a
skip (its loader reads none: `load_clt` never loads a `W_skip`), with some thresholds below zero (written
clamped at 0, the same latents fire). circuit-tracer reads each MLP's input after ln2's gain
(`mlp.hook_in`), ours before it; the writer folds the gain into W_enc.

Tolerances: the writer stores float32. In the float64 checks the CLT's weights are float32 numbers and
ln2's gains powers of two, so the files hold our weights exactly (dividing by a power of two is exact) and
circuit-tracer's float64 CLT is ours up to float64 rounding (1e-12). In float32 the gains are random
(1e-5). The graphs are held to the per-layer comparison's bounds: 1e-4 of each row's largest entry in
float32, 1e-6 in float64 (circuit-tracer stores its rows in float32; measured 1.4e-7).
"""
import pytest
import torch

import interp
from sprout import Sprout, SproutConfig
from sprout.tokenizer import train_bpe
from tests.conftest import randomize_gains

pytest.importorskip("circuit_tracer")

from benchmarks.graphs_peer import import_circuit_tracer, their_model, their_transcoders  # noqa: E402
from tests.interop.test_circuit_tracer_attribute import EOT, F32_ROW_REL, F64_ROW_REL, check_same_graph  # noqa: E402

ct_attribute = import_circuit_tracer()[0]
THREE = dict(context=64, n_layer=3, n_head=4, d_model=64, d_ff=128)


def tiny_model(exact_gains: bool):
    """A random 3-block Sprout with a tokenizer; ln2's gains powers of two where `exact_gains`."""
    tok = train_bpe("the cat sat on the mat. " * 20, vocab_size=300)
    torch.manual_seed(0)
    model = randomize_gains(Sprout(SproutConfig(vocab_size=tok.get_vocab_size(), **THREE)).eval())
    model.tokenizer = tok
    if exact_gains:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for block in model.blocks:
                block.norm2.weight.copy_(2.0 ** torch.randint(-2, 3, block.norm2.weight.shape, generator=g))
    return model


def random_clt(model, d_sae=48, seed=0):
    """A random JumpReLU CLT whose every weight is a float32 number (stored in float64)."""
    L, d = model.cfg.n_layers, model.cfg.d_model
    clt = interp.CrossLayerTranscoder(L, d, d_sae, kind="jumprelu", seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        clt.W_enc.mul_(3.0)
        clt.b_enc.copy_(0.3 * torch.randn(clt.b_enc.shape, generator=g) - 0.3)
        clt.threshold.copy_(0.4 * torch.rand(clt.threshold.shape, generator=g) - 0.1)  # some below 0
        for w in clt.W_dec:
            w.mul_(0.05)  # writes of the MLP outputs' size
        clt.b_dec.copy_(0.01 * torch.randn(clt.b_dec.shape, generator=g))
    return clt.eval()


def mlp_inputs(model, tokens):
    """Every block's MLP input, ours (ln2.hook_normalized) and circuit-tracer's (times ln2's gain), [layer, pos, d]."""
    names = [f"blocks.{l}.ln2.hook_normalized" for l in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens[None], names_filter=names)
    x = torch.stack([cache[n][0] for n in names])
    gains = torch.stack([b.norm2.weight.detach() for b in model.blocks])
    return x, x * gains[:, None]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_circuit_tracers_clt_loader_gives_our_encodings_and_reconstructions(tmp_path, dtype, tol):
    model = tiny_model(exact_gains=dtype == torch.float64).to(dtype)
    ours = random_clt(model).to(dtype)
    theirs = their_transcoders(ours, tmp_path / "clt", model, dtype)
    assert type(theirs).__name__ == "CrossLayerTranscoder" and theirs.W_skip is None
    assert (theirs.n_layers, theirs.d_transcoder, theirs.d_model) == (3, 48, 64)
    tokens = torch.randint(0, model.cfg.d_vocab, (12,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        x, x_mlp_in = mlp_inputs(model, tokens)
        acts = torch.stack([ours.encode(l, x[l]) for l in range(3)])
        assert 0.05 < (acts != 0).double().mean() < 0.6  # a sparse code, not an empty or a dense one
        for l in range(3):
            got = theirs.encode_layer(x_mlp_in[l], l)
            assert torch.equal(got != 0, acts[l] != 0)  # the same latents fire
            torch.testing.assert_close(got, acts[l], atol=tol, rtol=0)
        # its decode of our activations (a sparse [layer, pos, d_transcoder]): every later layer's write summed
        torch.testing.assert_close(theirs.decode(acts.to_sparse()), ours.decode(acts), atol=tol, rtol=0)
        torch.testing.assert_close(theirs(x_mlp_in), ours(x), atol=tol, rtol=0)


@pytest.mark.parametrize("dtype, row_rel", [(torch.float32, F32_ROW_REL), (torch.float64, F64_ROW_REL)])
def test_circuit_tracers_attribute_with_our_clt_gives_our_graph(tmp_path, dtype, row_rel):
    model = tiny_model(exact_gains=dtype == torch.float64)
    clt = random_clt(model)
    prompt = torch.cat([torch.tensor([EOT]), torch.randint(1, model.cfg.d_vocab, (11,),
                                                           generator=torch.Generator().manual_seed(3))])
    theirs = ct_attribute(prompt, their_model(model, clt, tmp_path, dtype=dtype), batch_size=64)
    ours = interp.attribute(model, prompt, clt, batch_size=64, dtype=dtype)
    got = check_same_graph(ours, theirs, row_rel)
    assert got["features"] > 50
