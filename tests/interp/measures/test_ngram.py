"""interp.measures.ngram.KneserNey: interpolated Kneser-Ney bigram and trigram models, by hand and against a plain
dictionary implementation; and loss_table's bigram / trigram columns."""
import doctest
import math
from collections import Counter

import pytest
import torch

import interp
from interp.measures import KneserNey, ngram
from sprout import Sprout, SproutConfig

# the toy text 0 1 0 2 0 1 over 4 ids (3 is never seen)
# bigrams: (0 1) x2, (1 0), (0 2), (2 0); contexts: c(0 .) = 3 with 2 kinds, c(1 .) = c(2 .) = 1
# continuation N1+(. w): w=0 after 1 and 2 -> 2; w=1 -> 1; w=2 -> 1; w=3 -> 0; N1+(. .) = 4, 3 ids seen
TOY = [0, 1, 0, 2, 0, 1]
D = 0.5
P1 = {0: 1.5 / 4 + D * 3 / 4 / 4, 1: 0.5 / 4 + D * 3 / 4 / 4, 2: 0.5 / 4 + D * 3 / 4 / 4, 3: D * 3 / 4 / 4}


def test_the_docstring_example_runs():
    result = doctest.testmod(ngram)
    assert result.attempted > 0 and result.failed == 0


def test_the_continuation_unigram_by_hand():
    lm = KneserNey(TOY, 4, order=2, discount=D)
    assert P1 == {0: 0.46875, 1: 0.21875, 2: 0.21875, 3: 0.09375}
    # context 3 was never seen: the bigram falls back to p1 whole
    assert lm.next_token_log_probs([3]).exp().tolist() == pytest.approx([P1[w] for w in range(4)], abs=1e-15)


def test_the_bigram_by_hand():
    lm = KneserNey(TOY, 4, order=2, discount=D)
    p = lm.next_token_log_probs([0]).exp().tolist()
    # after 0: counts 1 -> 2, 2 -> 1 of 3; the discounted mass D * 2 kinds / 3 goes to p1
    assert p[1] == pytest.approx((2 - D) / 3 + D * 2 / 3 * P1[1])
    assert p[2] == pytest.approx((1 - D) / 3 + D * 2 / 3 * P1[2])
    assert p[0] == pytest.approx(D * 2 / 3 * P1[0]) and p[3] == pytest.approx(D * 2 / 3 * P1[3])


def test_the_trigram_by_hand():
    lm = KneserNey(TOY, 4, order=3, discount=D)
    # trigrams (0 1 0), (1 0 2), (0 2 0), (2 0 1), once each; the middle order counts distinct left
    # neighbours of each pair: (0 2) after 1, (0 1) after 2 -> context 0 has total 2, 2 kinds
    q2_1_after_0 = (1 - D) / 2 + D * 2 / 2 * P1[1]
    p3_1_after_2_0 = (1 - D) / 1 + D * 1 / 1 * q2_1_after_0
    assert p3_1_after_2_0 == pytest.approx(0.6796875)
    # scoring 2 0 1: the first target (0 after 2) has one token before it: the bigram from raw counts
    p2_0_after_2 = (1 - D) / 1 + D * 1 / 1 * P1[0]
    assert lm.log_probs(torch.tensor([2, 0, 1])).exp().tolist() == pytest.approx([p2_0_after_2, p3_1_after_2_0])
    assert lm.log_probs([2, 0, 1], order=2).exp().tolist() == pytest.approx(
        [p2_0_after_2, KneserNey(TOY, 4, order=2, discount=D).next_token_log_probs([0]).exp()[1].item()])


def test_the_estimated_discounts_by_hand():
    lm = KneserNey(TOY, 4, order=3)
    # n1 / (n1 + 2 n2): continuation counts 2, 1, 1 -> 2 / 4; bigram counts 2, 1, 1, 1 -> 3 / 5;
    # trigram and middle counts all 1 -> 1
    assert lm.discounts == {1: 0.5, 2: 0.6, "2c": 1.0, 3: 1.0}


def slow_kneser_ney(seq, V, D):
    """The same model from dictionaries and loops, written from the formulas (docstring of interp.measures.ngram)."""
    bi, tri = Counter(zip(seq, seq[1:])), Counter(zip(seq, seq[1:], seq[2:]))
    cont = Counter(w for (_, w) in bi)
    mid = Counter((v, w) for (_, v, w) in tri)

    def p1(w):
        total = sum(cont.values())
        return max(cont[w] - D[1], 0) / total + D[1] * len(cont) / total / V

    def level(counts, ctx, w, d, lower):
        row = {k[-1]: c for k, c in counts.items() if k[:-1] == ctx}
        total = sum(row.values())
        return lower if total == 0 else max(row.get(w, 0) - d, 0) / total + d * len(row) / total * lower

    def p3(u, v, w):
        return level(tri, (u, v), w, D[3], level(mid, (v,), w, D["2c"], p1(w)))

    return lambda ctx, w: level(bi, (ctx[-1],), w, D[2], p1(w)) if len(ctx) == 1 else p3(ctx[-2], ctx[-1], w)


def test_agrees_with_a_plain_dictionary_implementation():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 12, (400,), generator=g)
    seq[200:260] = seq[100:160]  # some repeated stretches: trigram counts above one
    lm = KneserNey(seq, 13, order=3)
    slow = slow_kneser_ney(seq.tolist(), 13, lm.discounts)
    for ctx in ([3], [12], [3, 5], [12, 12], [seq[150].item(), seq[151].item()]):
        expected = [slow(ctx, w) for w in range(13)]
        assert lm.next_token_log_probs(ctx).exp().tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("order", [2, 3])
def test_every_distribution_sums_to_one_and_scores_agree_with_it(order):
    g = torch.Generator().manual_seed(1)
    train, test = torch.randint(0, 40, (2000,), generator=g), torch.randint(0, 50, (30,), generator=g)
    lm = KneserNey(train, 50, order=order)  # ids 40..49 never seen, in the test text too
    for i in range(1, len(test)):
        dist = lm.next_token_log_probs(test[:i].tolist())
        assert dist.exp().sum().item() == pytest.approx(1.0, abs=1e-12)
        assert (dist > -math.inf).all()  # an unseen id keeps a probability
        assert lm.log_probs(test)[i - 1].item() == pytest.approx(dist[test[i]].item(), abs=1e-12)


def test_the_trigram_uses_the_second_token_back():
    # after 0 the next token alternates 1, 2, 1, 2...: p(1 | 0) is a coin, p(1 | 2 0) is near certain
    train = [0, 1, 0, 2] * 200
    lm = KneserNey(train, 3, order=3)
    assert lm.loss(train, order=2) == pytest.approx(math.log(2) / 2, abs=0.01)  # half the targets are coins
    assert lm.loss(train) < 0.01


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="order must be 2 .bigram. or 3"):
        KneserNey([0, 1], 2, order=4)
    with pytest.raises(ValueError, match=r"tokens holds ids outside 0..3 \(d_vocab 4\)"):
        KneserNey([0, 5], 4)
    with pytest.raises(ValueError, match="tokens must be a 1-D sequence of integer token ids"):
        KneserNey(torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="discount must be in"):
        KneserNey([0, 1], 4, discount=1.5)
    with pytest.raises(ValueError, match="order must be 2 for this 2-gram model"):
        KneserNey([0, 1], 4).log_probs([0, 1], order=3)
    # a text too short for any bigram: the uniform guess
    assert KneserNey([1], 4).next_token_log_probs([1]).exp().tolist() == pytest.approx([0.25] * 4)


def test_loss_table_fits_the_ngrams_on_the_training_text():
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=5, context=8, n_layer=1, n_head=2, d_model=16, d_ff=32)).eval()
    train = torch.tensor([0, 1, 2, 3, 4] * 30)  # a cycle: each token fixes the next
    text = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1])  # windows of 8 and 4 tokens
    row = interp.loss_table(model, {"x": text}, train).iloc[0]
    lm = KneserNey(train, 5, order=3)
    windows = [text[:8], text[8:]]
    for col, order in (("bigram", 2), ("trigram", 3)):
        assert row[col] == pytest.approx(-torch.cat([lm.log_probs(w, order) for w in windows]).mean().item())
    assert row["bigram"] < 0.05 and row["trigram"] < 0.05 < row["unigram"]  # the cycle is predictable
    # a text against the cycle costs the n-grams far more than its unigram frequencies
    against = interp.loss_table(model, {"y": torch.tensor([4, 3, 2, 1, 0, 4, 3, 2])}, train).iloc[0]
    assert against["bigram"] > against["unigram"] + 1
    assert list(interp.loss_table(model, {"x": text}, train).columns) == [
        "source", "loss", "uniform", "unigram", "bigram", "trigram", "n"]
