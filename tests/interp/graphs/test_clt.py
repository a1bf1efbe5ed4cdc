"""Attribution graphs with a cross-layer transcoder (features written to every later MLP output), float64.

The replacement model must stay exact (logits equal the model's, errors included), every adjacency row plus
its constant must equal its target (forwards of the frozen model only), and a hand-built CLT whose one
feature writes only to a later MLP must show its edges there and nowhere earlier, as independent hooks on
the real model measure them."""
import pytest
import torch

import interp
from interp.graphs import ReplacementModel, attribute
from interp.graphs.dictionaries import CrossLayerDictionaries
from sprout import Sprout, SproutConfig
from tests.conftest import randomize_gains
from tests.interp.graphs.tiny import assert_rows_are_exact

FOUR = SproutConfig(vocab_size=256, context=64, n_layer=4, n_head=4, d_model=64, d_ff=128)


def four_layers(dtype=torch.float64):
    torch.manual_seed(0)
    return randomize_gains(Sprout(FOUR).eval()).to(dtype)


def random_clt(model, d_sae=32, skip=True, dtype=torch.float64, seed=0):
    L, d = model.cfg.n_layers, model.cfg.d_model
    clt = interp.CrossLayerTranscoder(L, d, d_sae, kind="jumprelu", skip=skip, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        clt.b_enc.copy_(0.3 * torch.randn(clt.b_enc.shape, generator=g, dtype=dtype) - 0.6)
        clt.threshold.fill_(0.05)
        for w in clt.W_dec:
            w.mul_(0.003)  # writes of the MLP outputs' size (about 0.01 in this random model)
        clt.b_dec.copy_(0.001 * torch.randn(clt.b_dec.shape, generator=g, dtype=dtype))
        if clt.W_skip is not None:
            clt.W_skip.copy_(0.001 * torch.randn(clt.W_skip.shape, generator=g, dtype=dtype))
    return clt


def tokens_of(model, n=8, seed=7):
    return torch.randint(0, model.cfg.d_vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_replacement_logits_equal_the_models_with_a_clt(dtype, tol):
    model = four_layers(dtype)
    rm = ReplacementModel(model, random_clt(model, dtype=dtype))
    assert isinstance(rm.dicts, CrossLayerDictionaries)
    tokens = tokens_of(model)
    with torch.no_grad():
        want = model(tokens[None])[0]
    assert (rm.forward(tokens) - want).abs().max() <= tol * max(1.0, want.abs().max().item())
    frozen = rm.freeze(tokens)
    # the errors are what the CLT misses at each MLP: the reconstruction with every source layer's write
    recon = rm.dicts.clt(torch.stack(frozen.x_in))
    torch.testing.assert_close(frozen.errors, torch.stack(frozen.mlp_out) - recon, atol=10 * tol, rtol=0)


@pytest.mark.parametrize("skip", [True, False])
def test_every_row_plus_its_constant_is_its_targets_value_with_a_clt(skip):
    model = four_layers()
    rm = ReplacementModel(model, random_clt(model, skip=skip))
    tokens = tokens_of(model)
    graph = attribute(rm, tokens, batch_size=32)
    assert graph.n_features == len(graph.active_features) > 30
    assert set(graph.active_features[:, 0].tolist()) == {0, 1, 2, 3}
    assert_rows_are_exact(rm, graph)


def _one_feature_clt(model, writes_to: int):
    """Every decoder zero but feature 0 of layer 0, which fires everywhere and writes v into MLP `writes_to`
    only; the features of later layers read at random and write nothing."""
    clt = random_clt(model, skip=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for w in clt.W_dec:
            w.zero_()
        clt.b_enc[0, 0] = 50.0
        clt.W_dec[0][0, writes_to] = torch.randn(model.cfg.d_model, generator=g, dtype=torch.float64)
        clt.threshold.zero_()
    return clt


def _frozen_hooks(rm, frozen, held_out: dict):
    """Hooks for the real model: patterns and scales frozen, MLP outputs replaced by the given values."""
    hooks = [(n, (lambda v: lambda act, hook: v)(v)) for n, v in frozen.frozen.items()]
    return hooks + [(f"blocks.{l}.hook_mlp_out", (lambda v: lambda act, hook: v)(v)) for l, v in held_out.items()]


def test_a_layer0_feature_writing_only_to_layer2_reaches_layer3_and_nothing_through_layer1():
    model = four_layers()
    rm = ReplacementModel(model, _one_feature_clt(model, writes_to=2))
    tokens = tokens_of(model)
    graph = attribute(rm, tokens, batch_size=64)
    feats = graph.active_features[graph.selected_features]
    p = 3
    src = [i for i, (l, pos, f) in enumerate(feats.tolist()) if (l, pos, f) == (0, p, 0)][0]
    column = graph.adjacency_matrix[:graph.n_features, src]
    by_layer = {l: column[feats[:, 0] == l] for l in range(4)}
    assert by_layer[1].abs().max() == 0 and by_layer[2].abs().max() == 0  # written after layer 2 reads
    assert by_layer[3].abs().max() > 1e-3
    # independent: the real model with patterns and scales frozen and every MLP output held at its clean value,
    # the feature's write a v added at MLP 2's output, position p: each layer-3 reader's pre-activation moves by its edge
    frozen = rm.freeze(tokens)
    a = frozen.acts[0][p, 0]
    v = rm.dicts.decoder(0, 2)[0]
    held = {l: m[None].clone() for l, m in enumerate(frozen.mlp_out)}
    moved = {l: m.clone() for l, m in held.items()}
    moved[2][0, p] += a * v
    runs = []
    for outs in (held, moved):
        seen = {}
        capture = ("blocks.3.ln2.hook_normalized", lambda act, hook: seen.update(x=act[0].clone()))
        with torch.no_grad():
            model.run_with_hooks(tokens[None], fwd_hooks=_frozen_hooks(rm, frozen, outs) + [capture])
        runs.append(rm.dicts.pre_acts(3, seen["x"]))
    layer3 = [(i, pos, f) for i, (l, pos, f) in enumerate(feats.tolist()) if l == 3]
    want = torch.stack([(runs[1] - runs[0])[pos, f] for _, pos, f in layer3])
    got = column[[i for i, _, _ in layer3]]
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    # the same feature written into MLP 0 instead does reach layers 1 and 2 (the check above can fail)
    early = attribute(ReplacementModel(model, _one_feature_clt(model, writes_to=0)), tokens, batch_size=64)
    efeats = early.active_features[early.selected_features]
    esrc = [i for i, t in enumerate(efeats.tolist()) if t == [0, p, 0]][0]
    assert early.adjacency_matrix[:early.n_features, esrc][efeats[:, 0] == 1].abs().max() > 1e-3


def test_a_clt_for_another_depth_or_model_is_refused():
    model = four_layers()
    with pytest.raises(ValueError, match="3 layers.*4 blocks"):
        ReplacementModel(model, interp.CrossLayerTranscoder(3, 64, 8, kind="jumprelu", dtype=torch.float64))
    with pytest.raises(ValueError, match="32-wide"):
        ReplacementModel(model, interp.CrossLayerTranscoder(4, 32, 8, kind="jumprelu", dtype=torch.float64))
    clt = random_clt(model)
    clt.model_fingerprint = "0" * 16
    with pytest.raises(ValueError, match="another model"):
        ReplacementModel(model, clt)
