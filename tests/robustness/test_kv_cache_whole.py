"""A key-value cache grows whole or not at all: a forward stopped early, or interrupted by a hook raising
(or Ctrl-C) in a later block, leaves the cache as it was, and a cache whose layers disagree is refused
by name (issue 36, bad case 5)."""
import pytest
import torch

from sprout import Sprout
from sprout.tl.kv_cache import cache_length, new_cache
from tests.conftest import TINY, randomize_gains


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def _ids(n, seed=0):
    return torch.randint(0, TINY.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def test_stop_at_layer_with_a_growing_cache_is_refused_and_leaves_it(model):
    cache = new_cache(model, 1)
    model(_ids(5), past_kv_cache=cache)
    with pytest.raises(ValueError, match="stop_at_layer=1 with past_kv_cache"):
        model(_ids(3, 1), past_kv_cache=cache, stop_at_layer=1)
    assert [e.past_keys.size(1) for e in cache.entries] == [5, 5] and cache.previous_attention_mask.shape == (1, 5)
    with pytest.raises(ValueError, match="start_at_layer=1 with past_kv_cache"):
        model(torch.zeros(1, 3, TINY.d_model), past_kv_cache=cache, start_at_layer=1)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_hook_raising_in_block_1_leaves_the_cache_as_it_was_and_the_next_call_is_right(model, error):
    prompt, more = _ids(6), _ids(2, 1)
    cache = new_cache(model, 1)
    model(prompt, past_kv_cache=cache)

    def boom(x, hook):
        raise error("stop")

    with pytest.raises(error):
        model.run_with_hooks(more, past_kv_cache=cache, fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    assert cache_length(cache) == 6 and {e.past_values.size(1) for e in cache.entries} == {6}
    assert cache.previous_attention_mask.shape == (1, 6)
    whole = model(torch.cat([prompt, more], 1))[:, -2:]
    assert torch.allclose(model(more, past_kv_cache=cache), whole, atol=1e-5)


def test_a_cache_whose_layers_disagree_is_named_spoilt(model):
    cache = new_cache(model, 1)
    model(_ids(4), past_kv_cache=cache)
    cache.entries[1].past_keys = cache.entries[1].past_keys[:, :2]
    with pytest.raises(ValueError, match="spoilt"):
        model(_ids(1), past_kv_cache=cache)


def _walkthrough():
    from sprout.walkthrough import WalkthroughConfig, WalkthroughGPT
    torch.manual_seed(0)
    return WalkthroughGPT(WalkthroughConfig(vocab_size=256, context=64, d_model=32, n_head=2, n_layer=2, dropout=0.0)).eval()


@pytest.mark.parametrize("which", ["sprout", "walkthrough"])
def test_a_generation_whose_cache_would_overflow_stops_before_it_keeping_the_tokens_made(model, which):
    """generate(return_cache=True) returns a cache of the whole sequence, which must fit the context: 60 prompt
    tokens and 10 new ones in a context of 64 used to make all 10 and then raise, losing them (issue 36 item 3).
    Now it stops after 4 with a warning naming the cut; the tokens are those a 4-token generation makes,
    and the cache is the one a run_with_cache of them gives."""
    m = model if which == "sprout" else _walkthrough()
    prompt = _ids(60, 2)
    with pytest.warns(UserWarning, match="would make 70, more than the context of 64.*stopping after 4 new tokens"):
        out, cache = m.generate(prompt, max_new_tokens=10, do_sample=False, return_cache=True, verbose=False)
    assert torch.equal(out, m.generate(prompt, max_new_tokens=4, do_sample=False, verbose=False))
    assert torch.equal(cache["blocks.1.hook_resid_post"], m.run_with_cache(out)[1]["blocks.1.hook_resid_post"])
    if which == "sprout":  # embeddings (rotary models only) with return_cache: refused before a token is made
        calls = []
        handle = m.blocks[0].register_forward_hook(lambda *args: calls.append(1))
        try:
            with pytest.raises(ValueError, match="return_cache=True.*needs token input"):
                m.generate(m.embed(prompt), max_new_tokens=3, return_cache=True, verbose=False)
        finally:
            handle.remove()
        assert calls == []
