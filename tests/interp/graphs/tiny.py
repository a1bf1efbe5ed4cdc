"""Tiny random models with random skip transcoders (float64), and the frozen model's target values computed
by forwards alone (no backward), for the graphs' tests."""
import torch

import interp
from interp.graphs import ReplacementModel
from sprout import Sprout
from sprout.walkthrough import build_step
from tests.conftest import TINY, randomize_gains


def random_transcoders(model, d_sae=48, k=5, kind="topk", dtype=torch.float64, seed=0):
    d = model.cfg.d_model
    out = []
    g = torch.Generator().manual_seed(seed)
    for layer in range(model.cfg.n_layers):
        tc = interp.Transcoder(d, d_sae, kind=kind, k=k if kind == "topk" else None, skip=True, layer=layer,
                               seed=seed + layer, dtype=dtype)
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(tc.W_enc.shape, generator=g, dtype=dtype) / d ** 0.5)
            tc.W_dec.mul_(0.05)  # outputs of the MLPs' size
            tc.W_skip.copy_(0.01 * torch.randn(tc.W_skip.shape, generator=g, dtype=dtype))
            tc.b_dec.copy_(0.01 * torch.randn(tc.b_dec.shape, generator=g, dtype=dtype))
            tc.b_enc.copy_(0.1 * torch.randn(tc.b_enc.shape, generator=g, dtype=dtype) - (0.0 if kind == "topk" else 1.0))
        out.append(tc)
    return out


def tiny_sprout(dtype=torch.float64):
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval()).to(dtype)


def tiny_walkthrough(dtype=torch.float64):
    torch.manual_seed(0)
    model = build_step("4.10").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model.to(dtype)


def target_values(rm: ReplacementModel, run, graph):
    """Every target of the graph in a frozen run: the selected features' pre-activations, then the logit
    nodes' values (the demeaned logit of a token target) [batch, n_features + n_logits]."""
    pre = run.pre_acts(rm.dicts)
    feats = graph.active_features[graph.selected_features].tolist()
    values = [pre[l][:, p, f] for l, p, f in feats]
    last = run.logits[:, -1]
    for _, idx in graph.logit_targets:
        values.append(last[:, idx] - last.mean(-1))
    return torch.stack(values, 1)


def zero_sources(frozen):
    """The frozen prompt with every node's source set to zero (token embeddings, features and errors past
    the prefix): (embed, acts, errors) for ReplacementModel.run."""
    acts = [a.clone() for a in frozen.acts]
    for a in acts:
        a[frozen.prefix:] = 0
    errors = frozen.errors.clone()
    errors[:, frozen.prefix:] = 0
    return torch.zeros_like(frozen.embed), acts, errors


def assert_rows_are_exact(rm: ReplacementModel, graph, atol: float = 1e-9, rtol: float = 0.0) -> None:
    """The exactness identity: every feature and logit row of the adjacency, summed, plus its constant (the
    target with every source zeroed) equals the target's value in the frozen run on the graph's prompt."""
    frozen = rm.freeze(graph.input_tokens)
    with torch.no_grad():
        value = target_values(rm, rm.run(frozen), graph)[0]
        embed, acts, errors = zero_sources(frozen)
        constant = target_values(rm, rm.run(frozen, embed=embed, acts=acts, errors=errors), graph)[0]
    s = graph.slices()
    rows = torch.cat([graph.adjacency_matrix[s["feature"]], graph.adjacency_matrix[s["logit"]]])
    torch.testing.assert_close(rows.sum(1) + constant, value, atol=atol, rtol=rtol)
