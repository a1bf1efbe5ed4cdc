"""Models for the ported TransformerLens tests: TL's own tests build a 3-layer model (d_model 10, 2 heads,
vocab 50, context 20); here the same shape of Sprout (d_model 16, as RoPE needs an even d_head) and the
walkthrough GPT's step 4.10 (learned positions, LayerNorm, biases) where a test reads `hook_pos_embed`."""
import pytest
import torch

from sprout import Sprout, SproutConfig
from sprout.walkthrough import build_step
from tests.conftest import randomize_gains

SMALL = SproutConfig(vocab_size=50, context=20, n_layer=3, n_head=2, d_model=16, d_ff=32)


@pytest.fixture
def small():
    torch.manual_seed(0)
    return randomize_gains(Sprout(SMALL).eval())


@pytest.fixture
def walk():
    torch.manual_seed(0)
    return build_step("4.10", vocab_size=50).eval()


@pytest.fixture
def ids():
    return torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
