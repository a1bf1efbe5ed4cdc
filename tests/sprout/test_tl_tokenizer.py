"""`model.tokenizer` as a Hugging Face PreTrainedTokenizerFast: TransformerLens' tokenizer helpers and
prompt lists on Sprout, each compared with the raw tokenizer or a computation by hand."""
import pytest
import torch
from datasets import Dataset
from transformer_lens import utilities as utils
from transformer_lens.head_detector import detect_head
from transformers import PreTrainedTokenizerFast

import sprout
from sprout import Sprout, SproutConfig, build_step
from sprout.tokenizer import EOT, char_tokenizer, raw, train_bpe
from tests.conftest import randomize_gains

TEXT = "the cat sat on the mat and the dog sat on the log. " * 40
CFG = SproutConfig(vocab_size=300, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(CFG, tokenizer=train_bpe(TEXT, vocab_size=300)).eval())


def test_tokenizer_is_a_pretrained_tokenizer_fast_with_gpt2_style_specials(model):
    tok = model.tokenizer
    assert isinstance(tok, PreTrainedTokenizerFast)
    eot = raw(tok).token_to_id(EOT)
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == eot
    assert tok.pad_token == EOT and tok.padding_side == "right"
    text = "the dog sat on the mat"
    assert tok(text)["input_ids"] == raw(tok).encode(text, add_special_tokens=False).ids
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.get_vocab_size() == raw(tok).get_vocab_size()  # the raw tokenizer's calls still answer
    assert model.cfg.default_prepend_bos is False


def test_character_tokenizer_has_a_pad_token_and_no_bos():
    walk = build_step("final", tokenizer=char_tokenizer("abc \n"), d_model=16, n_head=2, n_layer=1, context=16)
    tok = walk.tokenizer
    assert tok.bos_token_id is None and tok.pad_token_id == 0
    tokens = walk.to_tokens(["ab", "abc c"])
    assert tokens.tolist() == [[2, 3, 0, 0, 0], [2, 3, 4, 1, 4]]


def test_tokenize_and_concatenate_equals_the_raw_tokenizer(model):
    texts = ["the cat sat on the mat", "the dog sat on the log and the cat", "on the mat"] * 8
    ds = Dataset.from_dict({"text": texts})
    out = utils.tokenize_and_concatenate(ds, model.tokenizer, max_length=16, add_bos_token=False, num_proc=1)
    eot = model.tokenizer.eos_token_id
    # tokenize_and_concatenate joins the texts with EOS into one string and cuts it into rows
    ids = raw(model.tokenizer).encode(EOT.join(texts), add_special_tokens=False).ids
    rows = torch.tensor(ids[:len(ids) // 16 * 16]).view(-1, 16)
    got = out[:]["tokens"]
    assert got.shape[1] == 16 and eot in ids
    assert torch.equal(got, rows[:got.shape[0]])


@pytest.mark.parametrize("side", ["left", "right"])
def test_to_tokens_pads_a_list_of_texts(model, side):
    texts = ["the cat sat on the mat", "the dog"]
    rows = [model.to_tokens(t)[0].tolist() for t in texts]
    n = max(map(len, rows))
    pad = model.tokenizer.pad_token_id
    expected = [([pad] * (n - len(r)) + r) if side == "left" else (r + [pad] * (n - len(r))) for r in rows]
    assert model.to_tokens(texts, padding_side=side).tolist() == expected


def test_detect_head_on_a_list_of_prompts_equals_the_score_by_hand(model):
    prompts = ["the cat sat on the mat", "the dog", "on the log the dog sat on the mat"]
    scores = detect_head(model, prompts, "previous_token_head")
    by_hand = torch.zeros(CFG.n_layer, CFG.n_head)
    for p in prompts:
        _, cache = model.run_with_cache(p)
        for layer in range(CFG.n_layer):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [head, q, k], rows sum to 1
            by_hand[layer] += pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / pattern.size(-1)
    torch.testing.assert_close(scores.float(), by_hand / len(prompts), atol=1e-5, rtol=1e-4)


def test_checkpoint_still_saves_tokenizer_json(model, tmp_path):
    sprout.save(model, tmp_path / "ck")
    assert (tmp_path / "ck" / "tokenizer.json").is_file()
    loaded = sprout.load(tmp_path / "ck")
    assert isinstance(loaded.tokenizer, PreTrainedTokenizerFast)
    text = "the cat sat on the log"
    assert torch.equal(loaded.to_tokens(text), model.to_tokens(text))
    assert raw(loaded.tokenizer).to_str() == raw(model.tokenizer).to_str()
