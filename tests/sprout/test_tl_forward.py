"""TransformerLens' calling convention on Sprout and the walkthrough GPT, beside the course's contract.

Every TransformerLens function here runs unchanged and is compared with an independent computation
(hand-written cross-entropy, argmax loops, hand-made hooks).
"""
import contextlib
import io

import pytest
import torch
from transformer_lens import evals
from transformer_lens import utilities as utils
from transformer_lens.tools.analysis.attribution_patching import attribution_patch

from sprout import Sprout, SproutConfig, build_step
from sprout.model import GPT
from sprout.tokenizer import train_bpe
from tests.conftest import TINY, randomize_gains

TEXT = "the cat sat on the mat and the dog sat on the log. " * 40


def nll(logits, targets):
    """Independent cross-entropy per position: -log softmax(logits)[target]."""
    lp = logits.double().log_softmax(-1)
    return -lp.gather(-1, targets[..., None])[..., 0]


@pytest.fixture(scope="module")
def bpe_model():
    torch.manual_seed(0)
    cfg = SproutConfig(vocab_size=300, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)
    return randomize_gains(Sprout(cfg, tokenizer=train_bpe(TEXT, vocab_size=300)).eval())


@pytest.fixture(scope="module")
def walk():
    torch.manual_seed(0)
    return build_step("final", vocab_size=40, d_model=32, n_head=4, n_layer=2, context=32, dropout=0.0).eval()


# --- the two conventions -----------------------------------------------------------------------------

def test_return_types_match_an_independent_loss(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (3, 12))
    logits = tiny_model(ids, return_type="logits")
    assert type(logits) is torch.Tensor and logits.shape == (3, 12, TINY.vocab_size)
    per_token = nll(logits[:, :-1], ids[:, 1:])
    torch.testing.assert_close(tiny_model(ids, return_type="loss").double(), per_token.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tiny_model(ids, "loss", True).double(), per_token, rtol=1e-5, atol=1e-6)
    both_logits, both_loss = tiny_model(ids, return_type="both")
    assert torch.equal(both_logits, logits) and torch.equal(both_loss, tiny_model(ids, return_type="loss"))
    assert tiny_model(ids, return_type=None) is None
    with pytest.raises(ValueError, match="return_type must be one of"):
        tiny_model(ids, return_type="logit")


def test_targets_give_model_py_loss_through_return_type(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 9))
    targets = torch.randint(0, TINY.vocab_size, (2, 9))
    ref = tiny_model(ids, return_type="logits")
    loss = tiny_model(ids, return_type="loss", targets=targets)
    torch.testing.assert_close(loss.double(), nll(ref, targets).mean(), rtol=1e-5, atol=1e-6)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1, 1], [0] * 8 + [1]])
    logits, masked = tiny_model(ids, return_type="both", targets=targets, loss_mask=mask)
    assert torch.equal(logits, ref)
    torch.testing.assert_close(masked.double(), nll(ref, targets)[mask.bool()].mean(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="targets= is read only for a loss"):
        tiny_model(ids, targets=targets)


def test_the_forward_is_a_plain_tensor_that_unpacks_as_any_tensor(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (3, 5))
    out = tiny_model(ids)
    assert type(out) is torch.Tensor and out.shape == (3, 5, TINY.vocab_size)
    with pytest.raises(ValueError, match="too many values to unpack"):
        a, b = out
    with pytest.raises(ValueError, match="too many values to unpack"):
        a, b = tiny_model(ids)
    a, b = tiny_model(ids[:2])  # a batch of two unpacks into its rows
    # the rows of a batch of two, not bit for bit those of a batch of three: a matmul's blocking may follow
    # the batch size (seen on 2 cores under pytest-xdist)
    torch.testing.assert_close(a, out[0]), torch.testing.assert_close(b, out[1])
    with pytest.raises(ValueError, match="return_type must be one of"):
        tiny_model(ids, ids)  # the second positional argument is return_type, as in HookedTransformer


def test_stop_and_start_at_layer(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 7))
    _, cache = tiny_model.run_with_cache(ids)
    resid = tiny_model(ids, stop_at_layer=1)
    torch.testing.assert_close(resid, cache["blocks.1.hook_resid_pre"])
    fired = []
    tiny_model.run_with_hooks(ids, stop_at_layer=1, fwd_hooks=[("blocks.1.hook_resid_pre", lambda t, hook: fired.append(1))])
    assert fired == []  # as TransformerLens: no hook of the stop layer fires
    logits = tiny_model(resid, start_at_layer=1, return_type="logits")
    torch.testing.assert_close(logits, tiny_model(ids, return_type="logits"))
    loss = tiny_model(resid, start_at_layer=1, tokens=ids, return_type="loss")
    torch.testing.assert_close(loss.double(), nll(logits[:, :-1], ids[:, 1:]).mean(), rtol=1e-5, atol=1e-6)


# --- TransformerLens' own functions ----------------------------------------------------------------

def test_tl_utils_test_prompt_ranks_the_answer_as_computed_by_hand(bpe_model):
    prompt, answer = "the cat sat on the", " mat"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        utils.test_prompt(prompt, answer, bpe_model, prepend_space_to_answer=False, top_k=3)
    ids = bpe_model.to_tokens(prompt + answer)
    n = bpe_model.to_tokens(prompt).size(1)
    probs = bpe_model(ids, return_type="logits")[0, n - 1].softmax(-1)
    rank = int((probs > probs[ids[0, n]]).sum())
    assert f"Rank: {rank}" in buf.getvalue().replace("Rank: " + str(rank) + " ", "Rank: " + str(rank))


def test_tl_induction_loss_equals_the_loss_by_hand():
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=20000, context=64, n_layer=1, n_head=2, d_model=32, d_ff=64)).eval()
    torch.manual_seed(5)
    loss = evals.induction_loss(model, batch_size=2, subseq_len=16, device="cpu")
    torch.manual_seed(5)
    first = torch.randint(100, 20000, (2, 16))
    tokens = torch.cat([first, first], dim=1)
    with torch.no_grad():
        logits = model(tokens, return_type="logits")
    by_hand = nll(logits[:, :-1], tokens[:, 1:])[:, 17:].mean()
    torch.testing.assert_close(loss.double(), by_hand, rtol=1e-5, atol=1e-6)


def test_a_transformerlens_training_loop_trains_the_same_as_the_course_loop(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (4, 16))
    twin = GPT(TINY)  # the course's class, loading the TransformerLens class's state dict as it is
    twin.load_state_dict(tiny_model.state_dict())
    tl_opt = torch.optim.SGD(tiny_model.parameters(), lr=0.1)
    course_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    for _ in range(3):
        loss = tiny_model(ids, return_type="loss")  # as transformer_lens.tools.training.train writes it
        loss.backward()
        tl_opt.step()
        tl_opt.zero_grad()
        _, course = twin(ids[:, :-1], ids[:, 1:])  # the course's loop: targets are the next tokens
        course.backward()
        course_opt.step()
        course_opt.zero_grad()
        torch.testing.assert_close(loss, course)
    for (name, p), q in zip(tiny_model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_tl_attribution_patch_equals_activation_times_gradient(tiny_model):
    clean = torch.randint(0, TINY.vocab_size, (1, 6))
    corrupt = clean.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 1) % TINY.vocab_size

    def metric(logits):
        return logits[0, -1, 5] - logits[0, -1, 7]

    result = attribution_patch(tiny_model, clean, corrupt, metric)
    _, clean_cache = tiny_model.run_with_cache(clean)
    acts = {}

    def keep(t, hook):
        t.retain_grad()
        acts[hook.name] = t

    names = ["hook_embed", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out"]
    logits = tiny_model.run_with_hooks(corrupt, fwd_hooks=[(n, keep) for n in names])
    metric(logits).backward()
    checked = 0
    for node, score in result.node_scores.items():
        name = node.kind == "embed" and "hook_embed" or None
        if node.kind == "attn_head_out" and node.layer == 1:
            name = "blocks.1.attn.hook_z"
        if node.kind == "mlp_out" and node.layer == 0:
            name = "blocks.0.hook_mlp_out"
        if name is None:
            continue
        delta = (clean_cache[name] - acts[name].detach()) * acts[name].grad
        index = (0, node.position, node.head) if node.head is not None else (0, node.position)
        assert score == pytest.approx(float(delta[index].sum()), rel=1e-4, abs=1e-6), node
        checked += 1
    assert checked > 6 * 4


# --- padding and the attention mask ----------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_each_text_alone(bpe_model, side):
    texts = ["the cat sat on the mat", "the dog", "on the log the dog sat"]
    tokens, mask = bpe_model.to_tokens(texts, padding_side=side), None
    lengths = [bpe_model.to_tokens(t).size(1) for t in texts]
    assert len(set(lengths)) > 1
    logits = bpe_model(texts, padding_side=side, return_type="logits")
    _, cache = bpe_model.run_with_cache(texts, padding_side=side)
    for i, (t, n) in enumerate(zip(texts, lengths)):
        alone = bpe_model(t, return_type="logits")[0]
        real = slice(tokens.size(1) - n, None) if side == "left" else slice(0, n)
        torch.testing.assert_close(logits[i, real], alone, atol=2e-5, rtol=1e-4)
        pattern = cache["blocks.1.attn.hook_pattern"][i][:, real, :]  # [head, real query, key]
        pad_keys = torch.ones(tokens.size(1), dtype=torch.bool)
        pad_keys[real] = False
        assert float(pattern[..., pad_keys].abs().sum()) == 0.0  # padded keys get no attention
    mask = torch.zeros_like(tokens)
    for i, n in enumerate(lengths):
        mask[i, -n:] = 1 if side == "left" else 0
        if side == "right":
            mask[i, :n] = 1
    loss = bpe_model(tokens, attention_mask=mask, return_type="loss")
    pieces = [nll(bpe_model(t, return_type="logits")[0, :-1], bpe_model.to_tokens(t)[0, 1:]) for t in texts]
    torch.testing.assert_close(loss.double(), torch.cat(pieces).mean(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(bpe_model(texts, padding_side=side, return_type="loss"), loss)


@pytest.mark.parametrize("side", ["left", "right"])
def test_walkthrough_padding_matches_each_sequence_alone(walk, side):
    seqs = [torch.randint(0, 40, (n,)) for n in (9, 4, 6)]
    T = 9
    tokens = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, s in enumerate(seqs):
        where = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        tokens[i, where], mask[i, where] = s, 1
    logits = walk(tokens, attention_mask=mask, return_type="logits")
    for i, s in enumerate(seqs):
        torch.testing.assert_close(logits[i][mask[i].bool()], walk(s[None], return_type="logits")[0], atol=2e-5, rtol=1e-4)


def test_attention_mask_is_checked(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 4))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 3\) but the tokens have shape \(2, 4\)"):
        tiny_model(ids, attention_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="only 0"):
        tiny_model(ids, attention_mask=torch.full((2, 4), 2))
    with pytest.raises(ValueError, match="no real token"):
        tiny_model(ids, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))


# --- pos_slice on every hook ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["sprout", "walkthrough"])
@pytest.mark.parametrize("pos_slice", [1, 4, -1, (1, 3), [0, 2]])
def test_pos_slice_slices_every_hook_on_its_position_axis(tiny_model, walk, which, pos_slice):
    model = tiny_model if which == "sprout" else walk
    ids = torch.randint(0, 40, (2, 6))
    names = list(model.hook_dict)
    # as TransformerLens' run_with_cache (Slice.unwrap), an int keeps its axis: pos_slice=i is [i]
    index = [pos_slice] if isinstance(pos_slice, int) else (slice(*pos_slice) if isinstance(pos_slice, tuple) else pos_slice)
    seen = set()
    for split in (False, True):  # the input hooks fire only with TransformerLens' flags on
        model.set_use_split_qkv_input(split)
        model.set_use_hook_mlp_in(split)
        _, full = model.run_with_cache(ids, names_filter=names)
        _, part = model.run_with_cache(ids, names_filter=names, pos_slice=pos_slice)
        for name in full.keys():
            axis = 2 if name.endswith(("hook_pattern", "hook_attn_scores")) else 1
            expected = full[name][(slice(None),) * axis + (torch.tensor(index) if isinstance(index, list) else index,)]
            assert torch.equal(part[name], expected), name
        seen |= set(full.keys())
    model.set_use_split_qkv_input(False)
    model.set_use_hook_mlp_in(False)
    assert not {n for n in names if not n.endswith(("hook_attn_in", "hook_result"))} - seen


# --- small holes -------------------------------------------------------------------------------------------

def test_to_string_to_str_tokens_and_token_positions(bpe_model):
    import numpy as np

    ids = bpe_model.to_tokens("the cat sat on the mat the")[0]
    raw_tok = bpe_model.tokenizer.backend_tokenizer
    assert bpe_model.to_string(int(ids[1])) == raw_tok.decode([int(ids[1])])
    assert bpe_model.to_string(ids[1]) == raw_tok.decode([int(ids[1])])  # a 0-d tensor
    assert bpe_model.to_string(ids.numpy()) == raw_tok.decode(ids.tolist())
    pieces = [raw_tok.decode([i]) for i in ids.tolist()]
    assert bpe_model.to_str_tokens(ids.numpy()) == pieces
    assert bpe_model.to_str_tokens(np.stack([ids.numpy()] * 2)) == [pieces, pieces]
    # one unpadded list per text, TransformerLens' convention (issue 21.10)
    assert bpe_model.to_str_tokens(["the cat", "the"]) == [bpe_model.to_str_tokens("the cat"), bpe_model.to_str_tokens("the")]
    the = max(set(ids.tolist()), key=ids.tolist().count)  # " the", twice
    where = [i for i, t in enumerate(ids.tolist()) if t == the]
    assert len(where) >= 2
    assert bpe_model.get_token_position(the, ids) == where[0]
    assert bpe_model.get_token_position(pieces[where[0]], "the cat sat on the mat the", mode="last") == where[-1]
    with pytest.raises(ValueError, match="does not occur"):
        bpe_model.get_token_position(int(ids.max()) + 1, ids[:1])
    with pytest.raises(TypeError, match="integer"):
        bpe_model.to_string(torch.tensor([1.7]))


def test_loss_fn_matches_tl_and_by_hand(tiny_model):
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    logits = tiny_model(ids)
    torch.testing.assert_close(tiny_model.loss_fn(logits, ids, per_token=True).double(), nll(logits[:, :-1], ids[:, 1:]),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(tiny_model.loss_fn(logits, ids), utils.lm_cross_entropy_loss(logits, ids))


def test_generate_greedy_equals_an_argmax_loop(bpe_model):
    ids = bpe_model.to_tokens("the cat sat")
    out = bpe_model.generate(ids, max_new_tokens=6, do_sample=False, stop_at_eos=False, verbose=False)
    expected = ids
    for _ in range(6):
        nxt = bpe_model(expected, return_type="logits")[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, nxt], 1)
    assert torch.equal(out, expected)
    assert torch.equal(bpe_model.generate(ids, max_new_tokens=6, top_k=1, stop_at_eos=False), expected)
    text = bpe_model.generate("the cat sat", max_new_tokens=6, do_sample=False, stop_at_eos=False)
    assert text == bpe_model.to_string(expected[0])
    torch.manual_seed(0)
    course = bpe_model.generate(ids, 5)  # the course's generate(idx, max_new)
    assert course.shape == (1, ids.size(1) + 5) and torch.equal(course[:, :ids.size(1)], ids)
    import inspect
    params = inspect.signature(bpe_model.generate).parameters
    assert params["temperature"].default == 1.0 and params["top_p"].default is None


def test_generate_stops_at_eos_and_fills_finished_rows(bpe_model):
    eos = bpe_model.tokenizer.eos_token_id
    ids = bpe_model.to_tokens("the cat sat")
    greedy = bpe_model.generate(ids, max_new_tokens=3, do_sample=False, stop_at_eos=False)
    first = int(greedy[0, ids.size(1)])
    out = bpe_model.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=first)
    assert out.shape[1] == ids.size(1) + 1 and int(out[0, -1]) == first
    assert eos == bpe_model.tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_names_filter_takes_a_name_list_tuple_set_or_predicate_alike(tiny_model):
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"]
    ids = torch.randint(0, tiny_model.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for names_filter in (names, tuple(names), set(names), frozenset(names), lambda n: n in names):
            _, cache = tiny_model.run_with_cache(ids, names_filter=names_filter)
            assert sorted(cache.keys()) == sorted(names), names_filter
        assert list(tiny_model.run_with_cache(ids, names_filter=names[0])[1].keys()) == names[:1]
