"""BOS (`<|endoftext|>` first, as GPT-2) and lengths on the TransformerLens text contract: each result
against the raw tokenizer, a run on the same ids, or TransformerLens' own helpers."""
import re
import warnings

import pytest
import torch
from transformer_lens import utilities as utils

from sprout import Sprout, SproutConfig, build_step
from sprout.tokenizer import char_tokenizer, raw, train_bpe
from tests.conftest import randomize_gains

TEXT = "the cat sat on the mat and the dog sat on the log. " * 40
CFG = SproutConfig(vocab_size=300, context=32, n_layer=2, n_head=4, d_model=64, d_ff=128)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(CFG, tokenizer=train_bpe(TEXT, vocab_size=300)).eval())


def ids_of(model, text):
    return raw(model.tokenizer).encode(text, add_special_tokens=False).ids


def test_prepend_bos_puts_endoftext_first_and_the_default_follows_cfg(model):
    bos = raw(model.tokenizer).token_to_id("<|endoftext|>")
    assert model.tokenizer.bos_token_id == bos and model.cfg.default_prepend_bos is False
    text = "the dog sat on the mat"
    assert model.to_tokens(text).tolist() == [ids_of(model, text)]
    assert model.to_tokens(text, prepend_bos=True).tolist() == [[bos] + ids_of(model, text)]
    assert model.to_str_tokens(text, prepend_bos=True)[0] == "<|endoftext|>"
    model.cfg.default_prepend_bos = True
    try:
        assert model.to_tokens(text).tolist() == [[bos] + ids_of(model, text)]
        assert model.to_tokens(text, prepend_bos=False).tolist() == [ids_of(model, text)]
        assert model.get_token_position(" dog", text) == 2  # BOS, "the", " dog"
    finally:
        model.cfg.default_prepend_bos = False
    assert model.get_token_position(" dog", text) == 1
    assert model.get_token_position(" dog", text, prepend_bos=True) == 2


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_list_of_texts_gets_a_bos_each_then_padding(model, side):
    bos, pad = model.tokenizer.bos_token_id, model.tokenizer.pad_token_id
    texts = ["the cat sat on the mat", "the dog"]
    rows = [[bos] + ids_of(model, t) for t in texts]
    n = max(map(len, rows))
    want = [([pad] * (n - len(r)) + r) if side == "left" else (r + [pad] * (n - len(r))) for r in rows]
    assert model.to_tokens(texts, prepend_bos=True, padding_side=side).tolist() == want


def test_forward_and_run_with_cache_on_text_honour_prepend_bos(model):
    text = "the cat sat on the log"
    ids = model.to_tokens(text, prepend_bos=True)
    torch.testing.assert_close(model(text, prepend_bos=True, return_type="logits"), model(ids, return_type="logits"),
                               rtol=0, atol=0)
    logits, cache = model.run_with_cache(text, prepend_bos=True)
    _, by_ids = model.run_with_cache(ids)
    assert cache["blocks.0.hook_resid_pre"].shape[1] == ids.shape[1] == len(ids_of(model, text)) + 1
    assert torch.equal(cache["blocks.1.attn.hook_pattern"], by_ids["blocks.1.attn.hook_pattern"])
    # with ids in, prepend_bos is ignored, as in TransformerLens; it must still be a bool
    plain = model.to_tokens(text)
    assert torch.equal(model(plain, prepend_bos=True, return_type="logits"), model(plain, return_type="logits"))
    with pytest.raises(TypeError, match="prepend_bos must be True, False or None"):
        model(plain, prepend_bos="yes")


def test_tl_test_prompt_runs_with_bos_and_its_ranks_are_ours(model, capsys):
    prompt, answer = "the cat sat on the", " mat"
    utils.test_prompt(prompt, answer, model, prepend_bos=True, print_details=True, top_k=3)
    out = capsys.readouterr().out
    assert "Tokenized prompt: ['<|endoftext|>', 'the'" in out
    tokens = torch.cat([model.to_tokens(prompt, prepend_bos=True), model.to_tokens(answer)], 1)
    probs = model(tokens, return_type="logits")[0, -2].softmax(-1)
    rank = int((probs > probs[tokens[0, -1]]).sum())
    assert re.search(rf"Ranks of the answer tokens:.*\(' mat', {rank}\)", out)


def test_generate_with_bos_equals_an_argmax_loop_and_drops_the_bos_from_text(model):
    ids = model.to_tokens("the cat", prepend_bos=True)
    expected = ids
    for _ in range(5):
        expected = torch.cat([expected, model(expected, return_type="logits")[:, -1].argmax(-1, keepdim=True)], 1)
    out = model.generate("the cat", max_new_tokens=5, do_sample=False, stop_at_eos=False, prepend_bos=True,
                         return_type="tokens")
    assert torch.equal(out, expected)
    text = model.generate("the cat", max_new_tokens=5, do_sample=False, stop_at_eos=False, prepend_bos=True)
    assert text == model.to_string(expected[0, 1:]) and not text.startswith("<|endoftext|>")
    # an empty prompt starts a document from <|endoftext|>, as TransformerLens' generate("")
    empty = model.generate("", max_new_tokens=3, do_sample=False, stop_at_eos=False, return_type="tokens")
    assert empty[0, 0] == model.tokenizer.bos_token_id and empty.shape == (1, 4)


def test_a_character_tokenizer_has_no_bos_and_says_so():
    walk = build_step("4.10", tokenizer=char_tokenizer("abc \n"))
    calls = [lambda: walk.to_tokens("ab", prepend_bos=True), lambda: walk("ab", prepend_bos=True),
             lambda: walk.to_str_tokens("ab", prepend_bos=True), lambda: walk.run_with_cache("ab", prepend_bos=True),
             lambda: walk.generate("ab", 2, prepend_bos=True), lambda: walk.get_token_position("a", "ab", prepend_bos=True),
             lambda: utils.test_prompt("ab", "c", walk, prepend_bos=True, prepend_space_to_answer=False)]
    for call in calls:
        with pytest.raises(ValueError, match="prepend_bos=True needs a BOS token, and this WalkthroughGPT's tokenizer has none"):
            call()
    with pytest.raises(ValueError, match="the prompt is empty and there is no BOS"):
        walk.generate("", 2)


def test_to_tokens_truncates_as_transformer_lens_or_returns_every_token(model):
    long = "the cat sat on the mat " * 20
    ids = ids_of(model, long)
    assert len(ids) > CFG.context
    assert model.to_tokens(long).tolist() == [ids[:CFG.context]]
    bos = model.tokenizer.bos_token_id
    assert model.to_tokens(long, prepend_bos=True).tolist() == [[bos] + ids[:CFG.context - 1]]
    assert [len(r) for r in model.to_str_tokens([long, "the cat"])] == [CFG.context, 2]
    full = model.to_tokens(long, truncate=False)  # every token, as TransformerLens returns them
    assert full.tolist() == [ids]
    with pytest.raises(ValueError, match=rf"sequence of {len(ids)} tokens is longer .*sprout.tl.text.windows"):
        model(full)
    with pytest.warns(UserWarning, match="truncated to the model's context"):
        logits = model(long)  # the forward truncates text as TransformerLens does, saying so
    assert torch.equal(logits, model(model.to_tokens(long)))


def test_to_tokens_of_empty_text_is_as_transformer_lens(model):
    empty = model.to_tokens("")
    assert empty.shape == (1, 0) and empty.dtype == torch.long
    assert model.to_tokens("", prepend_bos=True).tolist() == [[model.tokenizer.bos_token_id]]
    assert model.to_str_tokens("") == []
    padded = model.to_tokens(["", "the cat"])
    assert padded.tolist() == [[model.tokenizer.pad_token_id] * 2, ids_of(model, "the cat")]
    assert model.to_tokens("the cat", move_to_device=False).device.type == "cpu"
    with pytest.raises(ValueError, match="the text is empty"):
        model("")


def test_to_str_tokens_of_a_list_gives_one_unpadded_list_per_text(model):
    texts = ["the cat sat on the mat", "the dog", "on"]
    got = model.to_str_tokens(texts)
    assert got == [model.to_str_tokens(t) for t in texts]
    assert [len(g) for g in got] == [len(ids_of(model, t)) for t in texts]
    assert model.to_str_tokens(texts, prepend_bos=True)[1][0] == "<|endoftext|>"
    rows = model.to_tokens(texts[:2])
    assert model.to_str_tokens([rows[0], rows[1]]) == [model.to_str_tokens(rows[0]), model.to_str_tokens(rows[1])]


def test_left_padded_ids_without_their_mask_warn(model):
    texts = ["the cat sat on the mat", "the dog"]
    ids, mask = model.to_tokens(texts, padding_side="left"), None
    with pytest.warns(UserWarning, match=r"rows \[1\] of these token ids begin with more pad tokens"):
        model(ids)
    mask = (torch.arange(ids.size(1)) >= ids.size(1) - len(ids_of(model, texts[1]))).long()
    mask = torch.stack([torch.ones_like(mask), mask])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(ids, attention_mask=mask)  # with the mask: no warning
        model(model.to_tokens(texts, padding_side="right"))  # right padding reads correctly
        model(ids, return_type="loss", targets=ids)  # the course's training call is not checked
        model(model.to_tokens(texts, padding_side="left", prepend_bos=True)[:1])  # one row
        model(model.to_tokens([t[:7] for t in texts], prepend_bos=True))  # every row starts with one BOS


def test_bos_losses_scores_the_same_tokens_as_a_forward_by_hand(model):
    from experiments.bos_loss import bos_losses

    text = "the cat sat on the mat.\n\nthe dog sat on the log and the cat sat."
    frame = bos_losses(model, text).set_index("where")
    stories = [model.to_tokens(s, prepend_bos=True)[:, :CFG.context] for s in text.split("\n\n")]
    with_bos = torch.cat([model(s, return_type="loss", loss_per_token=True)[0, 1:] for s in stories])
    without = torch.cat([model(s[:, 1:], return_type="loss", loss_per_token=True)[0] for s in stories])
    row = frame.loc["story starts"]
    assert row.tokens == with_bos.numel() == without.numel()
    assert row.with_bos == pytest.approx(with_bos.double().mean().item(), rel=1e-5)
    assert row.without_bos == pytest.approx(without.double().mean().item(), rel=1e-5)


def test_the_readme_bos_table_is_what_the_function_gives_for_gpt4():
    from pathlib import Path

    import sprout
    from experiments import readme as readme_blocks
    from experiments.bos_loss import BLOCK, bos_losses
    from experiments.common import held_out_text

    page = readme_blocks.home(BLOCK, Path(__file__).resolve().parents[2]).read_text(encoding="utf-8")
    block = readme_blocks.block(page, BLOCK)
    gpt4 = sprout.load("gpt-4").eval()
    gpt4.spec = "gpt-4"
    for r in bos_losses(gpt4, held_out_text(gpt4)).itertuples():
        assert f"| gpt-4 | {r.where} | {r.without_bos:.3f} | {r.with_bos:.3f} | {r.change:+.3f} | {r.tokens:,} |" in block
        assert r.change > 0  # the README's claim: a BOS in front hurts gpt-4
