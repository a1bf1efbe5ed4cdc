"""interp.loss_table: the model's loss per source beside the uniform and unigram baselines, by hand."""
import math

import pytest
import torch

import interp
from sprout import Sprout, SproutConfig
from sprout.tokenizer import char_tokenizer

CFG = SproutConfig(vocab_size=4, context=8, n_layer=1, n_head=2, d_model=16, d_ff=32)


def flat_model(cfg=CFG, tokenizer=None) -> Sprout:
    """All weights zero: every logit is 0, so every prediction costs ln(vocab)."""
    model = Sprout(cfg, tokenizer=tokenizer).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def test_unigram_of_a_known_distribution_by_hand():
    # counts of 0, 1, 2, 3 in train: 3, 1, 0, 0; add one: 4, 2, 1, 1 of 8
    train = torch.tensor([0, 0, 0, 1])
    assert interp.measures.unigram_log_probs(flat_model(), train).exp().tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125])
    table = interp.loss_table(flat_model(), {"a": torch.tensor([[0, 1, 2, 3]]), "b": torch.tensor([0, 0, 0])}, train)
    a, b = table.set_index("source").loc["a"], table.set_index("source").loc["b"]
    assert a["unigram"] == pytest.approx(-(math.log(0.25) + 2 * math.log(0.125)) / 3)  # targets 1, 2, 3
    assert b["unigram"] == pytest.approx(-math.log(0.5))
    assert table["loss"].tolist() == pytest.approx([math.log(4)] * 2)  # the flat model guesses uniformly
    assert table["uniform"].tolist() == pytest.approx([math.log(4)] * 2)
    assert table["n"].tolist() == [3, 2]


def test_windows_and_loss_agree_with_mean_loss():
    torch.manual_seed(0)
    model = Sprout(CFG).eval()
    ids = torch.randint(0, 4, (21,))  # windows of 8, 8 and 5 tokens: 7 + 7 + 4 targets
    row = interp.loss_table(model, {"x": ids}, ids).iloc[0]
    assert row["n"] == 18
    assert row["loss"] == pytest.approx(interp.mean_loss(model, ids), rel=1e-9)
    windows = [ids[0:8], ids[8:16], ids[16:21]]
    counts = torch.bincount(ids, minlength=4).double() + 1
    targets = torch.cat([w[1:] for w in windows])
    assert row["unigram"] == pytest.approx(-(counts / counts.sum()).log()[targets].mean().item())


def test_text_is_tokenised_by_the_models_tokenizer():
    tok = char_tokenizer("abcd")
    model = flat_model(SproutConfig(vocab_size=tok.get_vocab_size(), context=8, n_layer=1, n_head=2, d_model=16,
                                    d_ff=32), tokenizer=tok)
    table = interp.loss_table(model, {"text": "abab"}, "aaab")
    counts = {c: "aaab".count(c) + 1 for c in tok.get_vocab()}
    total = sum(counts.values())
    expected = -(math.log(counts["b"] / total) * 2 + math.log(counts["a"] / total)) / 3  # targets b, a, b
    assert table.loc[0, "unigram"] == pytest.approx(expected)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="smoothing must be > 0"):
        interp.loss_table(flat_model(), {"a": torch.tensor([0, 1])}, torch.tensor([0]), smoothing=0)
    with pytest.raises(ValueError, match=r"token id 9 is out of range for a vocabulary of 4"):
        interp.loss_table(flat_model(), {"a": torch.tensor([0, 1])}, torch.tensor([0, 9]))
    with pytest.raises(ValueError, match=r"texts\['a'\]: no window has two tokens"):
        interp.loss_table(flat_model(), {"a": torch.tensor([0])}, torch.tensor([0]))


def test_everyday_english_ships_with_the_package():
    text = interp.everyday_english()
    assert 2_300 < len(text.split()) < 2_800
    assert "Zorbin" not in text and "\r" not in text and text.isascii()  # a character model can read it
