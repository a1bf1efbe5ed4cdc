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
