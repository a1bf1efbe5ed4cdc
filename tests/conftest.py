"""Shared fixtures: a tiny random Sprout (2 layers, d_model 64) keeps the suite fast."""
import importlib.metadata
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from sprout import Sprout, SproutConfig

# TransformerLens 4's own functions that some tests compare against (patching.get_act_patch_direct_path, edge
# attribution patching, model_protocol): absent from 3.9, which SAELens' venv has (docs/compatibility.md)
TL4 = int(importlib.metadata.version("transformer-lens").split(".")[0]) >= 4
needs_tl4 = pytest.mark.skipif(not TL4, reason="compares with a TransformerLens 4 function (this environment has 3.x)")

torch.set_num_threads(1)  # tiny models: a second thread costs more than it gives on a busy 2-core machine


@pytest.fixture(autouse=True)
def one_thread():
    """Back to one thread after every test: a script's main called in-process sets its `--threads` (default:
    every core), and two xdist workers with two OpenMP threads each on 2 cores ran the rest of the suite
    several times slower (a 30 s test took 400 s)."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


TINY = SproutConfig(vocab_size=256, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)


def randomize_gains(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Norm gains start at 1; give them other values so a test sees whether they are applied."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return model


@pytest.fixture
def tiny_cfg() -> SproutConfig:
    return TINY


@pytest.fixture
def tiny_model() -> Sprout:
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


@pytest.fixture(scope="session")
def demo_measurements():
    """{demo name: (model, every number of the README's demo table)}, measured once per session with
    `experiments.demo_table` (the README's and the index page's functions and settings)."""
    import sprout
    from experiments import demo_table

    out = {}
    for name in demo_table.MODELS:
        model = sprout.load(name).eval()
        out[name] = (model, demo_table.measure(model, name))
    return out
