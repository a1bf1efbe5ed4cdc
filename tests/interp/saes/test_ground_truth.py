"""Ground truth (SynthSAEBench's idea): activations built from known sparse directions, recovered by train_sae.

Each row is a sparse sum of 32 random unit directions in 16 dimensions, the directions firing with
Zipf-like probabilities (about 2 per row) and magnitudes in [0.5, 1.5], plus a little noise. At the
true L0 every kind's decoder rows find the directions (mean over directions of the best cosine with any
row >= 0.9); a TopK or BatchTopK SAE told a wrong L0 (four times too many latents per row) does worse.
"""
import pytest
import torch

import interp

D, N_FEATURES, L0, D_SAE = 16, 32, 2, 64
RUN = dict(d_sae=D_SAE, steps=300, batch_size=256, lr=0.02, seed=1, progress=False)


def synthetic(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(N_FEATURES, D, generator=g)
    directions /= directions.norm(dim=-1, keepdim=True)
    p = 1 / torch.arange(1, N_FEATURES + 1).float() ** 0.5
    p = p / p.sum() * L0
    on = torch.rand(n, N_FEATURES, generator=g) < p
    magnitude = 0.5 + torch.rand(n, N_FEATURES, generator=g)
    return (on * magnitude) @ directions + 0.01 * torch.randn(n, D, generator=g), directions


@pytest.fixture(scope="module")
def data():
    return synthetic()


@pytest.fixture(scope="module")
def trained(data):
    """train(kind, k): an SAE trained on the data, each trained once for the module."""
    cache = {}

    def train(kind, k):
        if (kind, k) not in cache:
            cache[kind, k] = interp.train_sae(data[0], kind=kind, k=k, **RUN)  # relu / jumprelu: k is the target L0
        return cache[kind, k]

    return train


def mean_max_cosine(sae, directions):
    rows = sae.W_dec / sae.W_dec.norm(dim=-1, keepdim=True)
    return (directions @ rows.T).max(-1).values.mean().item()


@pytest.mark.parametrize("kind", ["relu", "topk", "batchtopk", "jumprelu", "matryoshka"])
def test_every_kind_recovers_the_true_directions_at_the_true_l0(data, trained, kind):
    acts, directions = data
    sae = trained(kind, L0)
    assert mean_max_cosine(sae, directions) >= 0.9
    l0 = (sae.encode(acts[:1000]) > 0).float().sum(-1).mean().item()
    assert abs(l0 - L0) < 0.5, l0


@pytest.mark.parametrize("kind", ["topk", "batchtopk"])
def test_a_wrong_l0_degrades_recovery(data, trained, kind):
    directions = data[1]
    right, wrong = (mean_max_cosine(trained(kind, k), directions) for k in (L0, 4 * L0))
    assert wrong < right - 0.1, (right, wrong)
