"""clt_metrics against independent code: a per-layer set written as a CLT (`from_transcoders`) must give each
layer the explained variance and L0 that `sae_metrics` measures for that transcoder alone, and a spliced loss
equal to the model run with every transcoder spliced in by `run_with_saes`; the same set gives the same
attribution graph as a CLT and as a list."""
import copy

import pytest
import torch
import torch.nn.functional as F

import interp
import sprout
from interp.saes.clt_metrics import clt_metrics, from_transcoders
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout


@pytest.fixture(scope="module")
def setup():
    model = tiny_sprout(torch.float32)
    tcs = random_transcoders(model, kind="jumprelu", dtype=torch.float32)
    for t in tcs:
        with torch.no_grad():
            t.threshold.fill_(0.05)
    ids = torch.randint(0, 256, (6, 32), generator=torch.Generator().manual_seed(5))
    return model, tcs, ids


def test_a_per_layer_set_as_a_clt_measures_what_each_transcoder_measures_alone(setup):
    model, tcs, ids = setup
    table = clt_metrics(model, from_transcoders(tcs), ids, batch_size=4)
    for l, t in enumerate(tcs):
        alone = interp.sae_metrics(model, t, ids, batch_size=4).iloc[0]
        row = table[table.layer == str(l)].iloc[0]
        assert row.explained_variance == pytest.approx(alone.explained_variance, abs=1e-5)
        assert row.l0 == pytest.approx(alone.l0, abs=1e-9) and row.l0 > 0
        assert row.dead_fraction == pytest.approx(alone.dead_fraction, abs=1e-9)
    total = table[table.layer == "all"].iloc[0]
    assert total.l0 == pytest.approx(table[table.layer != "all"].l0.sum())
    with torch.no_grad():
        logits, _ = interp.run_with_saes(model, ids, tcs)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)).item()
    assert total.ce_spliced == pytest.approx(ce, abs=1e-5)
    zero = [(f"blocks.{l}.hook_mlp_out", lambda act, hook: torch.zeros_like(act)) for l in range(2)]
    with torch.no_grad():
        logits = model.run_with_hooks(ids, fwd_hooks=zero)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)).item()
    assert total.ce_zero == pytest.approx(ce, abs=1e-5) and total.n_tokens == ids.numel()


def test_a_per_layer_set_of_two_widths_measures_what_each_transcoder_measures_alone(setup):
    """Padded to one width, a mixed set splices as the list does and counts dead latents among its own only."""
    model, tcs, ids = setup
    narrow = random_transcoders(model, d_sae=20, kind="jumprelu", dtype=torch.float32, seed=3)[1]
    with torch.no_grad():
        narrow.threshold.fill_(0.05)
        narrow.W_enc[:, :12] = 0  # latents that never fire: a dead fraction to count among 20, not 48
        narrow.b_enc[:12] = -1
    mixed = [tcs[0], narrow]
    clt = from_transcoders(mixed)
    assert clt.d_sae == 48 and clt.info["padded_widths"] == [48, 20]
    table = clt_metrics(model, clt, ids, batch_size=4)
    dead = interp.saes.clt_dead_fractions(model, clt, ids, batch_size=3)
    alone = [interp.sae_metrics(model, t, ids, batch_size=4).iloc[0] for t in mixed]
    for l, a in enumerate(alone):
        row = table[table.layer == str(l)].iloc[0]
        assert row.explained_variance == pytest.approx(a.explained_variance, abs=1e-5) and row.l0 == pytest.approx(a.l0)
        assert row.dead_fraction == pytest.approx(a.dead_fraction, abs=1e-9) == dead.dead_fraction.iloc[l]
    assert alone[1].dead_fraction >= 12 / 20
    every = (alone[0].dead_fraction * 48 + alone[1].dead_fraction * 20) / 68
    assert table.dead_fraction.iloc[-1] == pytest.approx(every) == dead.dead_fraction.iloc[-1]
    with torch.no_grad():
        logits, _ = interp.run_with_saes(model, ids, mixed)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)).item()
    assert table.ce_spliced.iloc[-1] == pytest.approx(ce, abs=1e-5)
    clt.info["padded_widths"] = [48, 49]
    with pytest.raises(ValueError, match="padded_widths"):
        clt_metrics(model, clt, ids)


def window_ce(logits, ids):
    """Each row's summed next-token cross-entropy, float64."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), ids[:, 1:], reduction="none").sum(-1)


def test_ce_recovered_standard_errors_are_the_delta_method_over_hand_run_windows():
    """With every MLP replaced (spliced by `run_with_saes`, zeroed by hand), each window's summed loss counted
    here; the delta-method error of the ratio of sums, each window a unit, and its jackknife agree. A trained
    model and its shipped per-layer set: a random model's MLPs move its loss too little for the ratio to mean much."""
    model = sprout.load("gpt-4").eval()
    tcs = [interp.load_transcoder(model, l, skip=False) for l in range(model.cfg.n_layers)]
    ids = model.to_tokens(interp.held_out_stories(6_000), truncate=False)[0, :24 * 48].reshape(24, 48)
    total = clt_metrics(model, from_transcoders(tcs), ids, batch_size=5).iloc[-1]
    zero = [(f"blocks.{l}.hook_mlp_out", lambda act, hook: torch.zeros_like(act)) for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        clean = window_ce(model(ids), ids)
        spliced = window_ce(interp.run_with_saes(model, ids, tcs)[0], ids)
        ablated = window_ce(model.run_with_hooks(ids, fwd_hooks=zero), ids)
    a, b = ablated - spliced, ablated - clean
    r, w = float(a.sum() / b.sum()), len(a)
    hand = float(((a - r * b).pow(2).sum() * w / (w - 1)).sqrt() / b.sum().abs())
    loo = (a.sum() - a) / (b.sum() - b)
    jackknife = float(((loo - loo.mean()).pow(2).sum() * (w - 1) / w).sqrt())
    assert total.ce_loss_recovered == pytest.approx(r, rel=1e-4) and 0.5 < r < 1
    assert total.ce_loss_recovered_se == pytest.approx(hand, rel=1e-3) and hand > 0
    assert total.ce_loss_recovered_se == pytest.approx(jackknife, rel=0.1)
    assert 0 < total.ce_loss_recovered_mean_se < 1
    with_lone = clt_metrics(model, from_transcoders(tcs), [*ids, *ids[:, :1]], batch_size=5).iloc[-1]
    assert with_lone.ce_loss_recovered_se == pytest.approx(total.ce_loss_recovered_se, rel=1e-3)  # one token: no unit
    one = clt_metrics(model, from_transcoders(tcs), ids[:1]).iloc[-1]
    assert one.ce_loss_recovered_se != one.ce_loss_recovered_se  # one window: NaN, no spread to measure


def test_a_per_layer_set_gives_the_same_graph_as_a_list_and_as_a_clt():
    model = tiny_sprout(torch.float64)
    tcs = random_transcoders(model, kind="jumprelu", dtype=torch.float64)
    tokens = torch.randint(0, 256, (8,), generator=torch.Generator().manual_seed(7))
    a = interp.attribute(model, tokens, tcs, batch_size=64)
    b = interp.attribute(model, tokens, from_transcoders(tcs), batch_size=64)
    assert a.n_features == b.n_features > 10
    assert torch.equal(a.active_features, b.active_features)
    torch.testing.assert_close(a.adjacency_matrix, b.adjacency_matrix, atol=1e-12, rtol=0)


def test_dead_fractions_alone_count_what_the_full_metrics_count(setup):
    model, tcs, ids = setup
    tcs = copy.deepcopy(tcs)
    for t in tcs:  # some latents never fire on these windows, so the count is not trivially 0 or 1
        with torch.no_grad():
            t.threshold[: t.d_sae // 3] = 1e6
    clt = from_transcoders(tcs)
    full, dead = clt_metrics(model, clt, ids, batch_size=4), interp.saes.clt_dead_fractions(model, clt, ids, batch_size=3)
    assert dead.layer.tolist() == full.layer.tolist() and (dead.n_tokens == ids.numel()).all()
    assert dead.dead_fraction.tolist() == full.dead_fraction.tolist()
    assert 1 / 3 <= dead.dead_fraction.iloc[-1] < 1
    with pytest.raises(ValueError, match="batch_size"):
        interp.saes.clt_dead_fractions(model, clt, ids, batch_size=0)


def test_bad_input_is_refused(setup):
    model, tcs, ids = setup
    with pytest.raises(TypeError, match="CrossLayerTranscoder"):
        clt_metrics(model, tcs, ids)
    with pytest.raises(ValueError, match="blocks 0..1 in order"):
        from_transcoders(tcs[::-1])
