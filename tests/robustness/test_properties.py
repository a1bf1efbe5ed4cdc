"""Properties, tried on inputs hypothesis draws: tokenizers give back the text they were given (and name
what they cannot represent), loaders refuse any renamed or reshaped tensor naming its key, RoPE is a
rotation whose scores depend only on the distance m - n, attention rows are causal and sum to one."""
import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sprout import Sprout
from sprout.files import checkpoint
from sprout.files.checkpoint import from_state_dict
from sprout.layers import apply_rope, rope_tables
from sprout.material import generate_corpus
from sprout.tokenizer import char_tokenizer, decode, encode, train_bpe
from tests.conftest import TINY, randomize_gains

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Many tiny forwards: on a busy machine a second thread costs more than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(generate_corpus(20_000, seed=3), vocab_size=320)


@pytest.fixture(scope="module")
def model() -> Sprout:
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


# --- tokenizers -----------------------------------------------------------------------------------------

@SETTINGS
@given(text=st.text(max_size=200))
def test_bpe_round_trips_any_text(bpe, text):
    ids = encode(bpe, text)
    assert all(0 <= i < bpe.get_vocab_size() for i in ids)
    assert decode(bpe, ids) == text
    assert (len(ids) == 0) == (text == "")


@SETTINGS
@given(alphabet=st.text(min_size=1, max_size=40), data=st.data())
def test_char_tokenizer_round_trips_its_alphabet_and_names_what_it_never_saw(alphabet, data):
    tok = char_tokenizer(alphabet)
    chars = sorted(set(alphabet))
    seen = data.draw(st.text(alphabet=chars, max_size=100), label="seen")
    ids = encode(tok, seen)
    assert ids == [chars.index(c) for c in seen]  # the walkthrough's stoi
    assert decode(tok, ids) == seen
    unseen = data.draw(st.text(min_size=1, max_size=5).filter(lambda s: not set(s) <= set(chars)), label="unseen")
    mixed = seen + unseen
    missing = sorted(set(mixed) - set(chars))
    with pytest.raises(ValueError) as err:
        encode(tok, mixed)
    assert str(err.value) == (f"{len(missing)} character(s) not in the tokenizer's vocabulary of {len(chars)}: "
                              f"{''.join(missing)!r}")


# --- loaders --------------------------------------------------------------------------------------------

STATE = {k: v.clone() for k, v in Sprout(TINY).state_dict().items()}
KEYS = sorted(STATE)


def refusal(state_dict) -> str:
    with pytest.raises(ValueError) as err:
        from_state_dict(state_dict, TINY, source="drawn")
    msg = str(err.value)
    assert msg.startswith("drawn: the weights do not fit a Sprout")
    return msg


@SETTINGS
@given(key=st.sampled_from(KEYS), new=st.text(alphabet="abcdefghij._0123456789", min_size=1, max_size=30))
def test_a_renamed_tensor_is_refused_naming_both_keys(key, new):
    assume(new not in STATE)
    sd = dict(STATE)
    sd[new] = sd.pop(key)
    msg = refusal(sd)
    assert f"\n  {new}: unexpected (found {tuple(STATE[key].shape)})" in msg
    if key != "head.weight":  # (a missing head is the tied embedding, stored once)
        assert f"\n  {key}: missing (expected {tuple(STATE[key].shape)})" in msg


@SETTINGS
@given(key=st.sampled_from(KEYS), data=st.data())
def test_a_reshaped_tensor_is_refused_naming_the_key_and_both_shapes(key, data):
    shape = list(STATE[key].shape)
    how = data.draw(st.sampled_from(["resize", "add a dim", "drop a dim"]), label="how")
    if how == "resize":
        d = data.draw(st.integers(0, len(shape) - 1), label="dim")
        shape[d] = data.draw(st.integers(1, 300).filter(lambda n: n != shape[d]), label="size")
    elif how == "add a dim":
        shape.insert(data.draw(st.integers(0, len(shape)), label="where"), data.draw(st.integers(1, 3)))
    else:
        assume(len(shape) > 1)
        shape.pop(data.draw(st.integers(0, len(shape) - 1), label="which"))
    assume(tuple(shape) != tuple(STATE[key].shape))
    sd = dict(STATE)
    sd[key] = torch.zeros(shape)
    if key == "embed.weight":
        sd["head.weight"] = sd[key]  # keep the tie, so only the shape is wrong
    msg = refusal(sd)
    assert f"\n  {key}: expected {tuple(STATE[key].shape)}, found {tuple(shape)}" in msg


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from([k for k in KEYS if k != "head.weight"]), rename=st.booleans())
def test_a_checkpoint_file_with_a_bad_key_is_refused_naming_it(tmp_path, key, rename):
    sd = {k: v for k, v in STATE.items() if k != "head.weight"}
    bad = key.replace("weight", "wieght") if rename else key
    sd[bad] = sd.pop(key) if rename else torch.zeros(3, *STATE[key].shape)
    torch.save({"model": sd, "config": TINY.to_dict()}, tmp_path / "m.pt")
    with pytest.raises(ValueError) as err:
        checkpoint.load(tmp_path / "m.pt")
    assert str(err.value).startswith(f"{tmp_path / 'm.pt'}: the weights do not fit a Sprout")
    assert f"\n  {bad}: " in str(err.value)


# --- RoPE -----------------------------------------------------------------------------------------------

@SETTINGS
@given(half=st.integers(1, 32), m=st.integers(0, 1000), n=st.integers(0, 1000), shift=st.integers(0, 1000),
       base=st.sampled_from([100.0, 10000.0, 500000.0]), seed=st.integers(0, 2 ** 31))
def test_rope_is_a_rotation_whose_scores_depend_only_on_m_minus_n(half, m, n, shift, base, seed):
    d_head = 2 * half
    cos, sin = rope_tables(d_head, 2001, base)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, d_head, generator=g), torch.randn(1, 1, 1, d_head, generator=g)

    def at(x, pos):  # x at position pos: [1, 1, 1, d_head]
        return apply_rope(x, cos[pos:pos + 1], sin[pos:pos + 1])

    for x, pos in ((q, m), (k, n)):  # each pair (i, i + d/2) turns by an angle: its length stays
        r = at(x, pos)
        pairs = lambda v: v[..., :half] ** 2 + v[..., half:] ** 2
        assert torch.allclose(pairs(r), pairs(x), rtol=1e-4, atol=1e-5)
        assert math.isclose(r.norm().item(), x.norm().item(), rel_tol=1e-5)
    assert torch.equal(at(q, 0), q)  # position 0 is no rotation
    score = (at(q, m) * at(k, n)).sum().item()
    shifted = (at(q, m + shift) * at(k, n + shift)).sum().item()
    assert math.isclose(score, shifted, abs_tol=2e-3 * q.norm().item() * k.norm().item())


# --- attention ------------------------------------------------------------------------------------------

@settings(SETTINGS, max_examples=30)
@given(batch=st.integers(1, 3), pos=st.integers(1, TINY.context), seed=st.integers(0, 2 ** 31))
def test_attention_rows_sum_to_one_are_causal_and_match_the_fused_path(model, batch, pos, seed):
    ids = torch.randint(0, TINY.vocab_size, (batch, pos), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        fused = model(ids)  # scaled_dot_product_attention: no hook reads the pattern
        logits, cache = model.run_with_cache(ids, names_filter=lambda n: n.endswith(("hook_pattern", "hook_attn_scores")))
    future = torch.ones(pos, pos, dtype=torch.bool).triu(1)
    for l in range(TINY.n_layer):
        pattern, scores = cache[f"blocks.{l}.attn.hook_pattern"], cache[f"blocks.{l}.attn.hook_attn_scores"]
        assert pattern.shape == (batch, TINY.n_head, pos, pos)
        assert torch.allclose(pattern.sum(-1), torch.ones(batch, TINY.n_head, pos), atol=1e-5)
        assert (pattern[..., future] == 0).all() and (pattern >= 0).all()
        assert torch.isneginf(scores[..., future]).all() and torch.isfinite(scores[..., ~future]).all()
    assert torch.allclose(logits, fused, atol=1e-4)


@settings(SETTINGS, max_examples=30)
@given(pos=st.integers(2, 32), prefix=st.integers(1, 32), seed=st.integers(0, 2 ** 31))
def test_first_layer_scores_depend_only_on_the_tokens_and_their_distance(model, pos, prefix, seed):
    # Layer 0's queries and keys see only their own token, so moving a text right by `prefix` tokens
    # (any tokens) must leave every score between two of its tokens unchanged.
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, TINY.vocab_size, (1, pos), generator=g)
    moved = torch.cat([torch.randint(0, TINY.vocab_size, (1, prefix), generator=g), text], dim=1)
    with torch.no_grad():
        _, a = model.run_with_cache(text, names_filter="blocks.0.attn.hook_attn_scores")
        _, b = model.run_with_cache(moved, names_filter="blocks.0.attn.hook_attn_scores")
    a, b = a["blocks.0.attn.hook_attn_scores"], b["blocks.0.attn.hook_attn_scores"][:, :, prefix:, prefix:]
    seen = ~torch.ones(pos, pos, dtype=torch.bool).triu(1)
    assert torch.allclose(a[..., seen], b[..., seen], atol=1e-4)
