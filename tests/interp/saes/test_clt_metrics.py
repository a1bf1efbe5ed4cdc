"""clt_metrics against independent code: a per-layer set written as a CLT (`from_transcoders`) must give each
layer the explained variance and L0 that `sae_metrics` measures for that transcoder alone, and a spliced loss
equal to the model run with every transcoder spliced in by `run_with_saes`; the same set gives the same
attribution graph as a CLT and as a list."""
import pytest
import torch
import torch.nn.functional as F

import interp
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


def test_a_per_layer_set_gives_the_same_graph_as_a_list_and_as_a_clt():
    model = tiny_sprout(torch.float64)
    tcs = random_transcoders(model, kind="jumprelu", dtype=torch.float64)
    tokens = torch.randint(0, 256, (8,), generator=torch.Generator().manual_seed(7))
    a = interp.attribute(model, tokens, tcs, batch_size=64)
    b = interp.attribute(model, tokens, from_transcoders(tcs), batch_size=64)
    assert a.n_features == b.n_features > 10
    assert torch.equal(a.active_features, b.active_features)
    torch.testing.assert_close(a.adjacency_matrix, b.adjacency_matrix, atol=1e-12, rtol=0)


def test_bad_input_is_refused(setup):
    model, tcs, ids = setup
    with pytest.raises(TypeError, match="CrossLayerTranscoder"):
        clt_metrics(model, tcs, ids)
    with pytest.raises(ValueError, match="blocks 0..1 in order"):
        from_transcoders(tcs[::-1])
