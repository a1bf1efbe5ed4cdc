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


@pytest.mark.parametrize("flags", [(), ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in"), ("use_attn_in",)])
def test_nnsight_reads_every_hook_point_bit_for_bit(wrapped, flags):
    model, nn_model = wrapped
    for flag in flags:  # the hook points that fire only with their flag on (as in TransformerLens)
        getattr(model, f"set_{flag}")(True)
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    try:
        logits, cache = model.run_with_cache(tokens)
        modules = dict(model.named_modules())  # TransformerLens 4's aliases (attn.hook_q_input) are names, not modules
        names = [n for n in cache.cache_dict if n in modules]  # in firing order, the order nnsight asks for them
        _read_all(nn_model, tokens, names, cache, logits)
    finally:
        for flag in flags:
            getattr(model, f"set_{flag}")(False)
    assert len(names) >= 48 and any(n.endswith("ln2.hook_normalized") for n in names)
    if flags:
        assert any(n.endswith(("hook_q_input", "hook_attn_in")) for n in names)


def _read_all(nn_model, tokens, names, cache, logits):
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
