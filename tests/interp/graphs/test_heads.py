"""Head loadings: the shares of an edge over one block's heads and the bypass sum to the edge, and each
share is the effect of the source through that head alone (a forward with the stream held after it)."""
import pytest
import torch

from interp.graphs import ReplacementModel, attribute, head_loadings
from tests.interp.graphs.tiny import random_transcoders, tiny_sprout, tiny_walkthrough

BUILDS = {"sprout": tiny_sprout, "walkthrough": tiny_walkthrough}


@pytest.mark.parametrize("name", BUILDS)
def test_shares_sum_to_every_edge_and_each_is_the_effect_through_its_head(name):
    model = BUILDS[name]()
    rm = ReplacementModel(model, random_transcoders(model))
    tokens = torch.randint(0, model.cfg.d_vocab, (7,), generator=torch.Generator().manual_seed(3))
    graph = attribute(rm, tokens)
    last = graph.n_layers - 1
    feats = graph.active_features[graph.selected_features]
    target = int((feats[:, 0] == last).nonzero()[0, 0])  # a feature of the last layer
    for node, layer in ((target, last), (graph.slices()["logit"].start, 0)):
        frame = head_loadings(rm, graph, node, layer)
        sums = frame.groupby("source").share.sum()
        edges = frame.groupby("source").edge.first()
        assert len(sums) > 10
        torch.testing.assert_close(torch.tensor(sums.values), torch.tensor(edges.values), atol=1e-10, rtol=0)
        heads = frame[frame["head"] >= 0]
        assert heads.share.abs().max() > 1e-4  # the heads do carry part of the edges
        check_token_share_by_forward(rm, graph, frame, node, layer, pos=graph.n_pos - 2)


def check_token_share_by_forward(rm, graph, frame, node, layer, pos):
    """Add token pos's embedding once more; let the change cross block `layer`'s attention through head h
    only (the stream after it = clean + the change of head h's write): the target moves by share_h."""
    frozen = rm.freeze(graph.input_tokens)
    src = graph.token_node(pos)
    H = rm.model.cfg.n_heads
    clean = {}
    rm.run(frozen, extra_hooks=[(f"blocks.{layer}.attn.hook_result", lambda a, hook: clean.__setitem__("r", a.detach())),
                                (f"blocks.{layer}.hook_resid_mid", lambda a, hook: clean.__setitem__("m", a.detach()))])
    embed = frozen.embed.clone()
    embed[pos] *= 2
    for h in range(H):
        def only_h(act, hook, h=h):
            return clean["m"] + (clean["now"][:, :, h] - clean["r"][:, :, h])
        hooks = [(f"blocks.{layer}.attn.hook_result", lambda a, hook: clean.__setitem__("now", a)),
                 (f"blocks.{layer}.hook_resid_mid", only_h)]
        with torch.no_grad():
            run = rm.run(frozen, embed=embed, extra_hooks=hooks)
            base = rm.run(frozen)
        moved = _target(rm, run, graph, node) - _target(rm, base, graph, node)
        share = frame[(frame.source == src) & (frame["head"] == h)].share
        assert float(moved.detach()) == pytest.approx(float(share.iloc[0]) if len(share) else 0.0, abs=1e-10)


def _target(rm, run, graph, node):
    s = graph.slices()
    if node < s["error"].start:
        l, p, f = graph.active_features[graph.selected_features[node]].tolist()
        return run.pre_acts(rm.dicts)[l][0, p, f]
    _, idx = graph.logit_targets[node - s["logit"].start]
    return run.logits[0, -1, idx] - run.logits[0, -1].mean()
