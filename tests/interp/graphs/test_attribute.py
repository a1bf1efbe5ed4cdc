"""Exactness of attribution graphs on tiny random models with random skip transcoders, in float64.

The edges come from backward passes; every check here uses forwards of the frozen model only (adding a
source, zeroing all of them) or autograd's second derivatives, so they are independent of how the rows
were computed."""
import pytest
import torch

from interp.graphs import ReplacementModel, attribute
from tests.interp.graphs.tiny import assert_rows_are_exact, random_transcoders, target_values, tiny_sprout, tiny_walkthrough

BUILDS = {"sprout": tiny_sprout, "walkthrough": tiny_walkthrough}


def setup(name, dtype=torch.float64, prefix=1):
    model = BUILDS[name](dtype)
    rm = ReplacementModel(model, random_transcoders(model, dtype=dtype), prefix=prefix)
    tokens = torch.randint(0, model.cfg.d_vocab, (8,), generator=torch.Generator().manual_seed(7))
    return model, rm, tokens


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_replacement_logits_equal_the_models(name, dtype, tol):
    model, rm, tokens = setup(name, dtype)
    with torch.no_grad():
        want = model(tokens[None])[0]
    assert (rm.forward(tokens) - want).abs().max() <= tol * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("prefix", [0, 1])
def test_every_row_plus_its_constant_is_its_targets_value(name, prefix):
    _, rm, tokens = setup(name, prefix=prefix)
    graph = attribute(rm, tokens, batch_size=32)
    assert graph.n_features == len(graph.active_features) > 20
    assert_rows_are_exact(rm, graph)
    assert graph.adjacency_matrix[graph.slices()["error"]].abs().sum() == 0  # no inputs
    assert (graph.active_features[:, 1] >= prefix).all()


def _perturbed_runs(rm, frozen, graph, sources, scale):
    """One copy per source node: that node's source vector added `scale` times, every other as it was."""
    B = len(sources)
    embed = frozen.embed.expand(B, -1, -1).clone()
    acts = [a.expand(B, -1, -1).clone() for a in frozen.acts]
    errors = frozen.errors[:, None].expand(-1, B, -1, -1).clone()
    feats = graph.active_features[graph.selected_features].tolist()
    s = graph.slices()
    for b, node in enumerate(sources):
        if node < s["error"].start:
            l, p, f = feats[node]
            acts[l][b, p, f] += scale * frozen.acts[l][p, f]
        elif node < s["token"].start:
            l, p = divmod(node - s["error"].start, graph.n_pos)
            errors[l, b, p] += scale * frozen.errors[l, p]
        else:
            p = node - s["token"].start
            embed[b, p] += scale * frozen.embed[p]
    with torch.no_grad():
        return target_values(rm, rm.run(frozen, batch=B, embed=embed, acts=acts, errors=errors), graph)


@pytest.mark.parametrize("name", BUILDS)
def test_adding_a_source_moves_every_target_by_its_column(name):
    """Doubling a source in the frozen model moves every target by its column (features, errors,
    tokens); a central finite difference of small step gives the same slope."""
    _, rm, tokens = setup(name)
    graph = attribute(rm, tokens, batch_size=16)
    frozen = rm.freeze(tokens)
    s = graph.slices()
    g = torch.Generator().manual_seed(1)
    sources = (torch.randperm(graph.n_features, generator=g)[:12].tolist()
               + [graph.error_node(l, p) for l in range(graph.n_layers) for p in (1, graph.n_pos - 1)]
               + list(range(s["token"].start, s["token"].stop)))
    with torch.no_grad():
        base = target_values(rm, rm.run(frozen), graph)[0]
    moved = _perturbed_runs(rm, frozen, graph, sources, 1.0) - base
    rows = torch.cat([torch.arange(graph.n_features), torch.arange(s["logit"].start, s["logit"].stop)])
    want = graph.adjacency_matrix[rows][:, sources].T
    torch.testing.assert_close(moved, want, atol=1e-9, rtol=0)
    h = 1e-3
    fd = (_perturbed_runs(rm, frozen, graph, sources, h) - _perturbed_runs(rm, frozen, graph, sources, -h)) / (2 * h)
    torch.testing.assert_close(fd, want, atol=1e-8, rtol=0)


def test_second_derivative_of_a_logit_wrt_the_embeddings_is_zero_in_the_frozen_model():
    _, rm, tokens = setup("sprout")
    frozen = rm.freeze(tokens)
    run = rm.run(frozen, grad=True)
    logit = run.logits[0, -1, 3] - run.logits[0, -1].mean()
    (grad,) = torch.autograd.grad(logit, run.embed, create_graph=True)
    v = torch.randn(grad.shape, generator=torch.Generator().manual_seed(2), dtype=grad.dtype)
    (hvp,) = torch.autograd.grad((grad * v).sum(), run.embed, allow_unused=True)
    assert hvp is None or hvp.abs().max() <= 1e-12
    # the live model is not linear: the same second derivative there is not zero (the test can fail)
    model = rm.model
    embed = frozen.embed[None].clone().requires_grad_(True)
    hooks = [("hook_embed", lambda act, hook: embed), (lambda n: n.endswith("hook_pattern"), lambda act, hook: act * 1.0)]
    live = model.run_with_hooks(tokens[None], fwd_hooks=hooks)  # softmax(scores) @ v: twice differentiable
    (g_live,) = torch.autograd.grad(live[0, -1, 3] - live[0, -1].mean(), embed, create_graph=True)
    (h_live,) = torch.autograd.grad((g_live * v).sum(), embed)
    assert h_live.abs().max() > 1e-3


def test_batch_size_does_not_change_the_graph_and_a_cap_keeps_the_most_influential_rows():
    _, rm, tokens = setup("sprout")
    full = attribute(rm, tokens, batch_size=64)
    small = attribute(rm, tokens, batch_size=5)
    assert full.info["backward_passes"] < small.info["backward_passes"]
    perm = _node_permutation(full, small)
    torch.testing.assert_close(small.adjacency_matrix, full.adjacency_matrix[perm][:, perm], atol=1e-12, rtol=0)
    capped = attribute(rm, tokens, batch_size=4, max_feature_nodes=10)
    assert capped.n_features == 10
    perm = _node_permutation(full, capped)
    # the rows kept are the full graph's rows, restricted to the kept columns
    torch.testing.assert_close(capped.adjacency_matrix, full.adjacency_matrix[perm][:, perm], atol=1e-12, rtol=0)
    # the first visited features are the most influential ones on the logits directly
    logit_rows = full.adjacency_matrix[full.slices()["logit"], :full.n_features].abs()
    direct = (full.logit_probabilities[:, None] * logit_rows / full.adjacency_matrix[full.slices()["logit"]].abs()
              .sum(1, keepdim=True)).sum(0)
    first = full.selected_features[direct.argmax()].item()
    assert capped.selected_features[0].item() == first


def _node_permutation(full, other):
    """Indices of other's nodes in full's node order."""
    where = {int(a): i for i, a in enumerate(full.selected_features)}
    feats = [where[int(a)] for a in other.selected_features]
    rest = list(range(full.n_features, full.n_nodes))
    return torch.tensor(feats + rest)


def test_targets_tokens_and_a_logit_difference():
    model, rm, tokens = setup("sprout")
    by_tokens = attribute(rm, tokens, target=[3, 17])
    assert [i for _, i in by_tokens.logit_targets] == [3, 17]
    V = model.cfg.d_vocab
    direction = torch.zeros(V, dtype=torch.float64)
    direction[3], direction[17] = 1.0, -1.0
    by_direction = attribute(rm, tokens, target=direction)
    assert by_direction.logit_targets == [("direction 0", V)]
    perm = _node_permutation(by_tokens, by_direction)[:-by_tokens.n_logits]  # features, errors, tokens
    rows = by_tokens.adjacency_matrix[by_tokens.slices()["logit"]]
    want = (rows[0] - rows[1])[perm]  # the means cancel in a difference
    torch.testing.assert_close(by_direction.adjacency_matrix[-1, :-1], want, atol=1e-10, rtol=0)


def test_default_targets_cover_the_probability_asked_for():
    model, rm, tokens = setup("sprout")
    graph = attribute(rm, tokens, desired_logit_prob=0.5, max_n_logits=200)
    with torch.no_grad():
        probs = torch.softmax(model(tokens[None])[0, -1], -1)
    got = graph.logit_probabilities
    torch.testing.assert_close(got, probs[graph.logit_tokens], atol=1e-12, rtol=0)
    assert got[:-1].sum() < 0.5 <= got.sum()
    assert (got[:-1] >= got[1:]).all()
    assert attribute(rm, tokens, max_n_logits=2).n_logits == 2
