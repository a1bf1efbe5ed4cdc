"""Exact edge patching against a hand-written patch of the same edge, on a tiny random Sprout in float64."""
import pytest
import torch

import interp
from interp.discovery import edge_graph, edge_scores, patch_edges
from tests.interp.discovery.conftest import CFG, metric
from tests.interp.patching.test_path import sender_write


def sender_output(model, tokens, sender):
    """What a sender adds to the stream [batch, pos, d_model] on `tokens` (path patching's hand-written reader)."""
    _, cache = model.run_with_cache(tokens)
    return sender_write(model, cache, sender)


@torch.no_grad()
def by_hand(model, clean, corrupted, sender, receiver, via):
    """The clean run with the receiver's own input shifted by (corrupted - clean) sender output, before its norm."""
    delta = sender_output(model, corrupted, sender) - sender_output(model, clean, sender)
    if via == "logits":
        name, index = f"blocks.{CFG.n_layer - 1}.hook_resid_post", None
    elif via == "mlp_in":
        name, index = f"blocks.{receiver[3:]}.hook_mlp_in", None
        model.set_use_hook_mlp_in(True)
    else:
        l, h = (int(x) for x in receiver[1:].split("H"))
        name, index = f"blocks.{l}.hook_{via}_input", h
        model.set_use_split_qkv_input(True)

    def hook(x, hook):
        x = x.clone()
        if index is None:
            return x + delta
        x[:, :, index] += delta
        return x
    try:
        with model.hooks(fwd_hooks=[(name, hook)]):
            return float(metric(model(clean)))
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)


EDGES = [("L0H1", "L2H0", "k"), ("embed", "L1H1", "q"), ("MLP0", "L2H1", "v"), ("L1H0", "MLP1", "mlp_in"),
         ("L2H1", "logits", "logits"), ("MLP2", "logits", "logits"), ("embed", "MLP0", "mlp_in")]


@pytest.mark.parametrize("edge", EDGES)
def test_exact_edge_patch_equals_a_hand_written_patch(model, pair, edge):
    clean, corrupted = pair
    ours = patch_edges(model, clean, corrupted, metric, [edge])
    assert ours == pytest.approx(by_hand(model, clean, corrupted, *edge), abs=1e-9)
    with torch.no_grad():
        assert abs(ours - float(metric(model(clean)))) > 1e-4  # the edge matters: the test can fail


def test_exact_scores_are_one_patch_each_and_flags_are_restored(model, pair):
    clean, corrupted = pair
    frame = edge_scores(model, clean, corrupted, metric, method="exact")
    assert len(frame) == edge_graph(model).n_edges
    row = frame[(frame.sender == "L0H1") & (frame.receiver == "L2H0") & (frame.via == "k")].iloc[0]
    with torch.no_grad():
        full = float(metric(model(clean)))
    assert row.score == pytest.approx(full - by_hand(model, clean, corrupted, "L0H1", "L2H0", "k"))
    assert not model.cfg.use_split_qkv_input and not model.cfg.use_hook_mlp_in and not model.cfg.use_attn_result


@pytest.mark.parametrize("chunk", [1, 5, 0])
def test_exact_scores_equal_one_dense_pass_per_edge(model, pair, chunk):
    """exact_scores' copies (one ablated edge each, applied slice by slice) equal a separate pass per edge through
    the dense weighting that mask learning uses, for every edge, whatever the number of copies per forward."""
    from interp.discovery.patching import ablated_outputs, circuit_metric, exact_scores, split_inputs
    clean, corrupted = pair
    with split_inputs(model) as graph:
        _, ablated = ablated_outputs(model, graph, clean, corrupted, "resample")
        ours = exact_scores(model, graph, clean, ablated, metric, chunk=chunk)
        full = circuit_metric(model, graph, clean, ablated, metric, torch.ones(graph.n_edges))
        for e in range(graph.n_edges):
            keep = torch.ones(graph.n_edges)
            keep[e] = 0.0
            assert float(ours[e]) == pytest.approx(full - circuit_metric(model, graph, clean, ablated, metric, keep), abs=1e-9)
    assert ours.abs().max() > 1e-4


def test_ablating_every_edge_is_the_ablated_model(model, pair):
    """Zero ablation of every edge into the logits leaves the final stream empty; resample of every edge is the corrupted run."""
    clean, corrupted = pair
    every = edge_graph(model).edges[["sender", "receiver", "via"]].itertuples(index=False)
    with torch.no_grad():
        corrupted_run = float(metric(model(corrupted)))
    assert patch_edges(model, clean, corrupted, metric, list(every)) == pytest.approx(corrupted_run, abs=1e-9)
    into_logits = [(s, "logits", "logits") for s in ["embed"] + [f"L{l}H{h}" for l in range(3) for h in range(2)]
                   + [f"MLP{l}" for l in range(3)]]
    assert patch_edges(model, clean, None, metric, into_logits, ablation="zero") == pytest.approx(0.0, abs=1e-9)


def test_mean_ablation_of_a_sender_uses_its_batch_mean(model, pair):
    clean, _ = pair
    out = sender_output(model, clean, "L1H0")
    delta = out.mean(0, keepdim=True) - out

    def hook(x, hook):
        return x + delta
    with torch.no_grad(), model.hooks(fwd_hooks=[(f"blocks.{CFG.n_layer - 1}.hook_resid_post", hook)]):
        expected = float(metric(model(clean)))
    assert patch_edges(model, clean, None, metric, [("L1H0", "logits", "logits")], ablation="mean") == pytest.approx(expected, abs=1e-9)


def test_bad_input(model, pair):
    clean, corrupted = pair
    with pytest.raises(ValueError, match="same shape"):
        edge_scores(model, clean, corrupted[:, :-1], metric, method="exact")
    with pytest.raises(ValueError, match="ablation must be"):
        edge_scores(model, clean, corrupted, metric, ablation="noise")
    with pytest.raises(ValueError, match="needs corrupted"):
        edge_scores(model, clean, None, metric)
    with pytest.raises(ValueError, match="no gradient"):
        edge_scores(model, clean, corrupted, lambda logits: metric(logits).detach(), method="eap")
    with pytest.raises(ValueError, match="no gradient"):
        edge_scores(model, clean, corrupted, lambda logits: metric(logits).detach(), method="eap-ig", steps=2)
    for budget in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"budget .* \(0, 1\]"):
            interp.discover(model, clean, corrupted, metric, method="eap", budget=budget)
    with pytest.raises(ValueError, match="unknown method"):
        edge_scores(model, clean, corrupted, metric, method="acdc-fast")
    with pytest.raises(ValueError, match="no edge"):
        patch_edges(model, clean, corrupted, metric, [("L2H0", "L0H1", "k")])
    with pytest.raises(ValueError, match="no TransformerLens config"):
        edge_graph(torch.nn.Linear(2, 2))

    class NoSplit(torch.nn.Module):  # a hooked model's surface without the split-input hooks
        cfg = model.cfg
        mod_dict = {k: v for k, v in model.mod_dict.items() if "input" not in k}
    with pytest.raises(ValueError, match="no split inputs .*hook_q_input"):
        edge_scores(NoSplit(), clean, corrupted, metric, method="eap")


def test_the_walkthrough_gpt_has_the_same_edges():
    """The walkthrough GPT (LayerNorm, learned positions, biases) has split inputs too: the same graph, and
    ablating every edge by resampling is its corrupted run."""
    from sprout import build_step

    torch.manual_seed(0)
    gpt = build_step("final", vocab_size=30, d_model=32, n_head=2, n_layer=2, context=16, dropout=0.0).eval()
    graph = edge_graph(gpt)
    assert graph.n_edges == 46
    g = torch.Generator().manual_seed(1)
    clean, corrupted = torch.randint(0, 30, (2, 8), generator=g), torch.randint(0, 30, (2, 8), generator=g)
    every = list(graph.edges[["sender", "receiver", "via"]].itertuples(index=False))
    with torch.no_grad():
        expected = float(metric(gpt(corrupted)))
    assert patch_edges(gpt, clean, corrupted, metric, every) == pytest.approx(expected, abs=1e-5)
