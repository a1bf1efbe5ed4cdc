"""Generation and the key-value cache on the TransformerLens contract: the cache against the uncached
forward (logits, hooks, tokens), batched prompts against each prompt alone, every generate option
against a direct computation or TransformerLens' own sampler, and bad options named."""
import pytest
import torch
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import sample_logits
from transformers import StoppingCriteria

from sprout import Sprout, SproutConfig, build_step
from sprout.tl.kv_cache import new_cache
from sprout.tokenizer import char_tokenizer, train_bpe
from tests.conftest import TINY, randomize_gains

TEXT = "the cat sat on the mat and the dog sat on the log. " * 40
CFG = SproutConfig(vocab_size=300, context=96, n_layer=2, n_head=4, d_model=64, d_ff=128)
GREEDY = dict(do_sample=False, stop_at_eos=False, verbose=False)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(CFG, tokenizer=train_bpe(TEXT, vocab_size=300)).eval())


@pytest.fixture(scope="module")
def walk():
    torch.manual_seed(0)
    return build_step("4.10", tokenizer=char_tokenizer("abcdefgh \n"), context=24).eval()


def argmax_loop(model, ids, n):
    for _ in range(n):
        ids = torch.cat([ids, model(ids[:, -model.cfg.n_ctx:], return_type="logits")[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


# --- the cache in the forward ----------------------------------------------------------------------

@pytest.mark.parametrize("which", ["sprout", "walkthrough"])
def test_cached_chunks_give_the_uncached_logits(model, walk, which):
    m = model if which == "sprout" else walk
    ids = torch.randint(0, m.cfg.d_vocab, (2, 20), generator=torch.Generator().manual_seed(1))
    full = m(ids, return_type="logits")
    cache = new_cache(m, 2)
    assert isinstance(cache, TransformerLensKeyValueCache)
    parts = [m(ids[:, :7], past_kv_cache=cache, return_type="logits")]
    parts += [m(ids[:, t:t + 1], past_kv_cache=cache, return_type="logits") for t in range(7, 12)]
    parts.append(m(ids[:, 12:], past_kv_cache=cache, return_type="logits"))
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)
    assert cache[0].past_keys.shape == (2, 20, m.cfg.n_heads, m.cfg.d_head)
    assert cache.previous_attention_mask.shape == (2, 20)


def test_the_cache_holds_keys_after_qk_norm_and_rope_and_hooks_fire_on_new_positions(model):
    ids = torch.randint(0, CFG.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    _, full = model.run_with_cache(ids)
    cache = new_cache(model, 1)
    model(ids[:, :9], past_kv_cache=cache)
    _, step = model.run_with_cache(ids[:, 9:], past_kv_cache=cache)
    for layer in range(CFG.n_layer):
        torch.testing.assert_close(cache[layer].past_keys, full[f"blocks.{layer}.attn.hook_rot_k"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache[layer].past_values, full[f"blocks.{layer}.attn.hook_v"], rtol=1e-5, atol=1e-5)
        assert step[f"blocks.{layer}.attn.hook_rot_q"].shape == (1, 1, CFG.n_head, CFG.d_model // CFG.n_head)
        pattern = step[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (1, CFG.n_head, 1, 10)  # the new query against every key
        torch.testing.assert_close(pattern, full[f"blocks.{layer}.attn.hook_pattern"][:, :, 9:], rtol=1e-5, atol=1e-6)
    # a hook on the new position changes what the cached run computes, as it would uncached
    zero_head = [("blocks.1.attn.hook_z", lambda z, hook: z.index_fill(2, torch.tensor([0]), 0.0))]
    cache = new_cache(model, 1)
    model(ids[:, :9], past_kv_cache=cache)
    hooked = model.run_with_hooks(ids[:, 9:], past_kv_cache=cache, fwd_hooks=zero_head, return_type="logits")
    by_hand = model.run_with_hooks(ids, fwd_hooks=zero_head, return_type="logits")[:, 9:]
    torch.testing.assert_close(hooked, by_hand, rtol=1e-5, atol=1e-5)


def test_a_frozen_cache_is_read_not_grown(model):
    ids = torch.randint(0, CFG.vocab_size, (1, 8), generator=torch.Generator().manual_seed(3))
    cache = new_cache(model, 1)
    model(ids[:, :6], past_kv_cache=cache)
    cache.freeze()
    a = model(ids[:, 6:], past_kv_cache=cache, return_type="logits")
    b = model(ids[:, 6:], past_kv_cache=cache, return_type="logits")
    assert torch.equal(a, b) and cache[0].past_keys.size(1) == 6
    torch.testing.assert_close(a, model(ids, return_type="logits")[:, 6:], rtol=1e-5, atol=1e-5)


def test_left_padded_rows_through_the_cache_equal_each_row_alone(model):
    texts = ["the cat sat on the mat and", "the dog"]
    ids, mask = model.to_tokens(texts, padding_side="left"), None
    mask = (ids != model.tokenizer.pad_token_id).long()
    cache = new_cache(model, 2)
    model(ids, attention_mask=mask, past_kv_cache=cache)
    nxt = torch.tensor([[5], [7]])
    out = model(nxt, past_kv_cache=cache, return_type="logits")
    for row, text in enumerate(texts):
        alone = model(torch.cat([model.to_tokens(text), nxt[row:row + 1]], 1), return_type="logits")[:, -1]
        torch.testing.assert_close(out[row, -1], alone[0], rtol=1e-4, atol=1e-4)


def test_bad_caches_are_named(model):
    ids = torch.randint(0, CFG.vocab_size, (2, 4))
    with pytest.raises(ValueError, match=r"past_kv_cache holds keys of shape \(1, 0, 4, 16\), but this input needs \[2"):
        model(ids, past_kv_cache=new_cache(model, 1))
    with pytest.raises(TypeError, match="past_kv_cache must be a TransformerLensKeyValueCache"):
        model(ids, past_kv_cache={"keys": 1})
    cache = new_cache(model, 2)
    model(torch.randint(0, CFG.vocab_size, (2, CFG.context - 2)), past_kv_cache=cache)
    with pytest.raises(ValueError, match=f"holds {CFG.context - 2} positions and 4 more would make"):
        model(ids, past_kv_cache=cache)


# --- generate with and without the cache -------------------------------------------------------------

@pytest.mark.parametrize("which", ["sprout", "walkthrough"])
def test_greedy_with_the_cache_equals_without_and_an_argmax_loop(model, walk, which):
    m = model if which == "sprout" else walk
    prompt = m.to_tokens("the cat sat" if which == "sprout" else "abc ha")
    n = m.cfg.n_ctx + 6 - prompt.size(1)  # past the context: both slide a window
    cached = m.generate(prompt, n, use_past_kv_cache=True, output_logits=True, **GREEDY)
    plain = m.generate(prompt, n, use_past_kv_cache=False, output_logits=True, **GREEDY)
    assert torch.equal(cached.sequences, plain.sequences)
    assert torch.equal(cached.sequences, argmax_loop(m, prompt, n))
    assert len(cached.logits) == n and cached.logits[0].shape == (1, m.cfg.d_vocab)
    for a, b in zip(cached.logits, plain.logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(plain.logits[0], m(prompt, return_type="logits")[:, -1])


def test_prompts_of_unequal_length_each_get_their_own_continuation(model):
    texts = ["the cat sat on the mat and the", "the dog", "on the log the dog sat"]
    alone = [model.generate(t, 8, return_type="tokens", **GREEDY) for t in texts]
    for cache in (True, False):
        together = model.generate(texts, 8, use_past_kv_cache=cache, return_type="tokens", **GREEDY)
        for row, one in zip(together, alone):
            assert torch.equal(row[-one.size(1):], one[0])  # left-padded: the prompt and its continuation end each row
        assert model.generate(texts, 8, use_past_kv_cache=cache, **GREEDY) == [model.to_string(a[0]) for a in alone]
    # ids with either padding: their mask, or padding_side to read it off the pad token
    for side in ("left", "right"):
        ids = model.to_tokens(texts, padding_side=side)
        mask = (ids != model.tokenizer.pad_token_id).long()
        out = model.generate(ids, 8, attention_mask=mask, return_type="str", **GREEDY)
        assert out == [model.to_string(a[0]) for a in alone]
        assert model.generate(ids, 8, padding_side=side, return_type="str", **GREEDY) == out


def test_return_types_and_extras(model):
    prompt = model.to_tokens("the cat sat")
    tokens = model.generate(prompt, 5, **GREEDY)
    assert torch.equal(model.generate("the cat sat", 5, return_type="tokens", **GREEDY), tokens)
    assert model.generate(prompt, 5, return_type="str", **GREEDY) == model.to_string(tokens[0])
    embeds = model.generate(prompt, 5, return_type="embeds", **GREEDY)
    torch.testing.assert_close(embeds, model.embed(tokens))
    # embeddings in: the same continuation; "input" gives embeddings back, "tokens" the new ids only (as TL)
    from_embeds = model.generate(model.embed(prompt), 5, return_type="tokens", **GREEDY)
    assert torch.equal(from_embeds, tokens[:, prompt.size(1):])
    torch.testing.assert_close(model.generate(model.embed(prompt), 5, **GREEDY), embeds)
    out, cache, given = model.generate(prompt, 5, return_cache=True, return_input_tokens=True,
                                       names_filter="blocks.0.hook_resid_post", **GREEDY)
    assert torch.equal(out, tokens) and torch.equal(given, prompt)
    _, by_hand = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], by_hand["blocks.0.hook_resid_post"])
    with pytest.raises(TypeError, match=r"max_new"):  # the course's keyword is sprout.model.GPT's, not this one's
        model.generate(prompt, max_new=3, stop_at_eos=False, verbose=False)


def test_sampling_is_transformer_lens_sample_logits(model):
    prompt = model.to_tokens("the cat sat on the")
    logits = model(prompt, return_type="logits")[:, -1]
    for kwargs in (dict(top_k=5), dict(top_p=0.5), dict(freq_penalty=2.0), dict(temperature=0.7, top_k=3)):
        torch.manual_seed(7)
        ours = model.generate(prompt, 1, stop_at_eos=False, verbose=False, **kwargs)[0, -1]
        torch.manual_seed(7)
        theirs = sample_logits(logits, tokens=prompt, **kwargs)[0]
        assert int(ours) == int(theirs), kwargs
    # repetition_penalty applies to greedy too, as in TransformerLens
    rep = model.generate(prompt, 1, repetition_penalty=50.0, **GREEDY)[0, -1]
    assert int(rep) == int(sample_logits(logits, temperature=0.0, repetition_penalty=50.0, tokens=prompt)[0])


def test_stops(model):
    prompt = model.to_tokens("the cat")
    P = prompt.size(1)
    free = model.generate(prompt, 6, **GREEDY)
    new = free[0, P:].tolist()

    def upto(token):  # the output up to the first time `token` is drawn
        return free[:, :P + new.index(token) + 1]

    last = new[-1]
    assert torch.equal(model.generate(prompt, 6, eos_token_id=last, do_sample=False, verbose=False), upto(last))
    assert torch.equal(model.generate(prompt, 6, stop=[new[0]], **GREEDY), upto(new[0]))
    text = model.to_string(free[0, P:P + 2])
    stopped = model.generate(prompt, 6, stop_strings=text, return_type="tokens", **GREEDY)
    ends = next(n for n in range(P + 1, free.size(1) + 1) if model.to_string(free[0, :n]).endswith(text))
    assert torch.equal(stopped, free[:, :ends])  # the first step whose text ends with the stop string

    class AfterTwo(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.size(0),), input_ids.size(1) >= P + 2, dtype=torch.bool)

    assert torch.equal(model.generate(prompt, 6, stopping_criteria=AfterTwo(), **GREEDY), free[:, :P + 2])
    # a batch: a finished row is filled with the EOS until every row has stopped
    two = model.generate(torch.cat([prompt, prompt.flip(1)]), 6, **GREEDY)
    filled = model.generate(torch.cat([prompt, prompt.flip(1)]), 6, eos_token_id=last, do_sample=False, verbose=False)
    stop_at = P + new.index(last) + 1
    assert torch.equal(filled[0, :stop_at], two[0, :stop_at]) and (filled[0, stop_at:] == last).all()


@pytest.mark.parametrize("name, value, error", [
    ("freq_penalty", -1.0, "freq_penalty must be a finite number in"), ("freq_penalty", "a", "freq_penalty"),
    ("top_k", 0, "top_k must be None or an integer >= 1"), ("top_k", 2.5, "top_k"), ("top_p", 1.5, "top_p"),
    ("temperature", -0.1, "temperature"), ("temperature", float("nan"), "temperature"),
    ("repetition_penalty", 0.0, "repetition_penalty"), ("max_new_tokens", -1, "max_new_tokens"),
    ("max_new_tokens", 2.0, "max_new_tokens"), ("return_type", "logits", "return_type must be one of"),
    ("stop", "the", "stop must be a token id or a list of token ids"), ("stop", [1.5], "stop must hold token ids"),
    ("eos_token_id", 10**6, "eos_token_id must hold token ids in"), ("padding_side", "middle", "padding_side"),
    ("do_sample", "yes", "do_sample must be True or False"), ("use_past_kv_cache", 1, "use_past_kv_cache"),
    ("stop_strings", 3, "stop_strings must be a str"), ("stopping_criteria", print, "stopping_criteria must be"),
    ("pixel_values", torch.zeros(1), "pixel_values is for vision"), ("forced_bos_token_id", 1, "forced_bos_token_id"),
    ("attention_mask", torch.ones(1, 5, dtype=torch.long), "attention_mask has shape"), ("prepend_bos", "no", "prepend_bos"),
    ("num_beams", 4, "num_beams"),
])
def test_bad_options_are_named(model, name, value, error):
    with pytest.raises((ValueError, TypeError), match=error):
        model.generate(model.to_tokens("the cat sat"), 2, **{name: value})


def test_the_walkthrough_refuses_embeddings_in(walk):
    with pytest.raises(ValueError, match="adds them to the token embeddings: pass token ids"):
        walk.generate(torch.zeros(1, 3, walk.cfg.d_model), 2)


def test_no_tokenizer_generates_from_ids():
    torch.manual_seed(0)
    tiny = Sprout(TINY).eval()
    ids = torch.randint(0, TINY.vocab_size, (2, 5))
    assert torch.equal(tiny.generate(ids, 4, **GREEDY), argmax_loop(tiny, ids, 4))


# --- TransformerLens' tests/integration/test_kv_cache.py, ported (its prompts; BOS asked for explicitly,
# as our default is False; atol as TL's for gpt2) -----------------------------------------------------

ATOL = 1e-4


def tl_cache(model, batch):
    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)


@pytest.mark.parametrize("post", [" Sharon", " to buy myself a mandolin"])
def test_tl_single_and_multiple_new_tokens(model, post):
    pre = model.to_tokens("I went to Staten Island,", prepend_bos=True)
    new = model.to_tokens(post, prepend_bos=False)
    no_cache = model(torch.cat([pre, new], -1))
    cache = tl_cache(model, 1)
    model(pre, past_kv_cache=cache)
    with_cache = model(new, past_kv_cache=cache)
    assert torch.allclose(no_cache[:, -new.size(1):], with_cache, atol=ATOL)


@pytest.mark.parametrize("pre_padding", ["left", "right", None])
@pytest.mark.parametrize("post_padding", ["left", "right", None])
def test_tl_multi_token_batch(model, pre_padding, post_padding):
    padded_pre, unpadded_pre = ["It's always locked", "I'd rather be burned in Canada"], ["It's always locked", "It's always blocked"]
    padded_post, unpadded_post = [" by the magistrate", " than to freeze here in the South"], [" by the magistrate", " by the candidate"]
    first_post = model.to_tokens(padded_post[0], prepend_bos=False)
    first_full = torch.cat([model.to_tokens(padded_pre[0], prepend_bos=True), first_post], -1)
    expected = model(first_full)[0, -first_post.size(1):]
    pre = (model.to_tokens(unpadded_pre, prepend_bos=True) if pre_padding is None
           else model.to_tokens(padded_pre, prepend_bos=True, padding_side=pre_padding))
    post = (model.to_tokens(unpadded_post, prepend_bos=False) if post_padding is None
            else model.to_tokens(padded_post, prepend_bos=False, padding_side=post_padding))
    cache = tl_cache(model, pre.size(0))
    model(pre, past_kv_cache=cache, padding_side=pre_padding, prepend_bos=True)
    cache.freeze()
    got = model(post, past_kv_cache=cache, padding_side=post_padding, prepend_bos=False)
    got = got[0, -first_post.size(1):] if post_padding in ("left", None) else got[0, :first_post.size(1)]
    assert torch.allclose(expected.softmax(-1), got.softmax(-1), atol=ATOL)


def test_tl_freeze_cache(model):
    pre = model.to_tokens("I went to Staten Island,", prepend_bos=True)
    new_1 = model.to_tokens(" I'm headed to the church to play bingo.", prepend_bos=False)
    new_2 = model.to_tokens(" shine your light on me, Miss Liberty", prepend_bos=False)
    cache_1, cache_2 = tl_cache(model, 1), tl_cache(model, 1)
    model(pre, past_kv_cache=cache_1)
    cache_1.freeze()
    logits_1 = model(new_1, past_kv_cache=cache_1)
    model(pre, past_kv_cache=cache_2)
    cache_2.freeze()
    model(new_2, past_kv_cache=cache_2)
    for e1, e2 in zip(cache_1.entries, cache_2.entries):
        assert torch.allclose(e1.past_keys, e2.past_keys, atol=1e-3) and torch.allclose(e1.past_values, e2.past_values, atol=1e-3)
    assert torch.allclose(logits_1, model(new_1, past_kv_cache=cache_2), atol=ATOL)
    cache_2.unfreeze()
    again = model(new_1, past_kv_cache=cache_2)
    assert all(e1.past_keys.size(1) < e2.past_keys.size(1) for e1, e2 in zip(cache_1.entries, cache_2.entries))
    assert torch.allclose(logits_1, again, atol=ATOL)
    assert not torch.allclose(logits_1, model(new_1, past_kv_cache=cache_2), atol=ATOL)


def test_tl_kv_cache_with_custom_attention_mask(model):
    pre = model.to_tokens("An apple", prepend_bos=True)
    a, junk, b = (model.to_tokens(t, prepend_bos=False) for t in (" a day keeps", " junk", " the"))
    post, whole = torch.cat([a, junk, b], -1), torch.cat([pre, a, b], -1)  # TL's prompts, cut where the junk is
    mask = torch.cat([torch.ones_like(a), torch.zeros_like(junk), torch.ones_like(b)], -1)
    cache = tl_cache(model, 1)
    model(pre, past_kv_cache=cache)
    assert torch.allclose(model(whole)[:, -1], model(post, attention_mask=mask, past_kv_cache=cache)[:, -1], atol=ATOL)


def test_tl_kv_cache_and_start_at_layer(model):
    pre = model.to_tokens("I went to Staten Island,", prepend_bos=True)
    new = model.to_tokens(" Sharon", prepend_bos=False)
    no_cache = model(torch.cat([pre, new], -1))
    cache = tl_cache(model, 1)
    model(pre, past_kv_cache=cache)
    cache.freeze()
    full_mask = torch.ones(1, pre.size(1) + new.size(1), dtype=torch.long)  # what TL's input_to_embed returns with a cache
    resid_1 = model(new, stop_at_layer=1, past_kv_cache=cache)  # the stream leaving block 0 (TL: no blocks.1.* hook fires)
    with_cache = model(resid_1, start_at_layer=1, tokens=new, attention_mask=full_mask, past_kv_cache=cache)
    assert torch.allclose(no_cache[:, -new.size(1):], with_cache, atol=ATOL)
