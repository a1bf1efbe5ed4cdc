"""Shared by the discovery tests: a tiny random 3-layer Sprout in float64 (weights large enough that every
head and MLP matters), a pair of token batches, and a logit-difference metric."""
import dataclasses

import pytest
import torch

from sprout import Sprout
from tests.conftest import TINY, randomize_gains

CFG = dataclasses.replace(TINY, n_layer=3, n_head=2, d_model=32, d_ff=48, vocab_size=40)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    m = randomize_gains(Sprout(CFG).double().eval())
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(20)  # large enough weights that heads and MLPs matter
    return m


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 40, (3, 7), generator=g), torch.randint(0, 40, (3, 7), generator=g)


def metric(logits):
    return (logits[:, -1, 5] - logits[:, -1, 9]).mean()
