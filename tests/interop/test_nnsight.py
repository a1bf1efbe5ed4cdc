"""nnsight on a Sprout: every hook point read bit for bit as `run_with_cache` caches it, and written, without
a TransformerLens hook attached first (the interop venv: `.ci/run` builds it)."""
import pytest
import torch

from tests.conftest import TINY, randomize_gains

nnsight = pytest.importorskip("nnsight")

from sprout import Sprout  # noqa: E402


def _module(root, name: str):
    for part in name.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


@pytest.fixture(scope="module")
def wrapped():
    torch.manual_seed(0)
    model = randomize_gains(Sprout(TINY).eval())
    return model, nnsight.NNsight(model)


def test_nnsight_reads_every_hook_point_bit_for_bit(wrapped):
    model, nn_model = wrapped
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens)
    names = list(cache.cache_dict)  # in the order they fire, which is the order nnsight asks for them
    assert len(names) >= 40 and any(n.endswith("ln2.hook_normalized") for n in names)
    saved = {}
    with torch.no_grad(), nn_model.trace(tokens):
        for n in names:
            saved[n] = _module(nn_model, n).output.save()
        out = nn_model.output.save()
    for n in names:
        assert torch.equal(saved[n], cache[n]), n
    assert torch.equal(out, logits)


def test_an_edit_through_nnsight_is_the_edit_through_a_hook(wrapped):
    model, nn_model = wrapped
    tokens = torch.randint(0, TINY.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    for name in ("blocks.0.attn.hook_pattern", "blocks.1.ln2.hook_normalized", "blocks.0.ln1.hook_scale"):
        def halve(x, hook):
            return x * 0.5
        want = model.run_with_hooks(tokens, fwd_hooks=[(name, halve)])
        with torch.no_grad(), nn_model.trace(tokens):
            point = _module(nn_model, name)
            point.output = point.output * 0.5
            got = nn_model.output.save()
        assert torch.equal(got, want), name
        assert not torch.equal(got, model(tokens)), name  # the edit reached the logits
