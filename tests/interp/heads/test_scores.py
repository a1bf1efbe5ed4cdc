"""Head detectors: known masks, a hand-built model with known heads, agreement with TransformerLens."""
import pytest
import torch
from transformer_lens.head_detector import detect_head

import interp
from sprout import Sprout, SproutConfig
from sprout.layers import apply_rope, rope_tables

TINY = SproutConfig(vocab_size=256, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)
PREVIOUS = {(0, 0), (1, 3)}  # the hand-built model's previous-token heads; the rest attend to themselves


def _keys(mask):
    return {q: [k for k in range(mask.shape[-1]) if mask[0, q, k]] for q in range(mask.shape[-1]) if mask[0, q].any()}


def test_target_masks_known_answers():
    t = torch.tensor([[5, 6, 7, 5, 6, 8, 5]])
    assert _keys(interp.heads.target_mask(t, "previous_token")) == {q: [q - 1] for q in range(1, 7)}
    assert _keys(interp.heads.target_mask(t, "duplicate_token")) == {3: [0], 4: [1], 6: [0, 3]}
    # the key after each earlier occurrence of the query's token
    assert _keys(interp.heads.target_mask(t, "prefix_matching")) == {3: [1], 4: [2], 6: [1, 4]}
    # ... whose match extends back one more token: at 4 ("5 6" again) the key is 2; at 6, key 4 needs
    # t[2] == t[5] (7 vs 8): no; key 1 has nothing before its match and stays
    assert _keys(interp.heads.target_mask(t, "induction")) == {3: [1], 4: [2], 6: [1]}
    with pytest.raises(ValueError, match="unknown head kind"):
        interp.heads.target_mask(t, "copying")


def hand_built() -> Sprout:
    """Real weights, no hooks: every head's query and key are fixed vectors, so RoPE alone sets the pattern.

    Every token's embedding has coordinate 0 equal to 1; W_Q and W_K read only that coordinate, so after
    QK-norm each head's q and k are the same vectors at every position. With q = u (each RoPE pair (1, 0))
    and k = u rotated by one position, q . k is largest at distance m - n = 1: a previous-token head.
    With k = u it is largest at distance 0: a head that attends to the current token. The QK-norm gain
    (30) makes the softmax nearly one-hot. Attention and MLP outputs are zero, so every block reads the
    embedding.
    """
    torch.manual_seed(0)
    model = Sprout(TINY).eval()
    d, dh = TINY.d_model, TINY.d_head
    u = torch.cat([torch.ones(dh // 2), torch.zeros(dh // 2)])
    cos, sin = rope_tables(dh, 2, TINY.rope_base)
    u_next = apply_rope(u[None, None, None], cos[1:2], sin[1:2]).reshape(dh)  # u rotated by one position
    with torch.no_grad():
        model.embed.weight[:, 0] = 1.0
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
        for l, block in enumerate(model.blocks):
            W = torch.zeros(3 * d, d)
            for h in range(TINY.n_head):
                W[h * dh:(h + 1) * dh, 0] = u  # query
                W[d + h * dh:d + (h + 1) * dh, 0] = u_next if (l, h) in PREVIOUS else u  # key
            W[2 * d:] = torch.randn(d, d) * 0.02  # values: anything
            block.attn.qkv.weight.copy_(W)
            block.attn.q_norm.weight.fill_(30.0)
            block.attn.k_norm.weight.fill_(30.0)
            block.attn.proj.weight.zero_()
            block.ffn.w2.weight.zero_()
    return model


def test_hand_built_heads_get_the_scores_they_should():
    model = hand_built()
    prev = interp.head_scores(model, "previous_token", half_len=20, n_seqs=4)
    scores = {(r.layer, r.head): r.score for r in prev.itertuples()}
    assert set(zip(prev.layer[:2], prev["head"][:2])) == PREVIOUS  # best first
    for lh, s in scores.items():
        assert s == pytest.approx(1.0 if lh in PREVIOUS else 0.0, abs=1e-3), lh
    for kind in ("duplicate_token", "induction", "prefix_matching"):
        assert interp.head_scores(model, kind, half_len=20, n_seqs=4).score.max() < 1e-3, kind


def _force(pattern_fn):
    def hook(pattern, hook):  # pattern [batch, head, q, k]
        return pattern_fn(pattern)
    return hook


def test_forced_patterns_get_exact_scores(tiny_model):
    """Patterns replaced through hook_pattern (the hook runs before the score reads it)."""
    tokens = interp.repeated_tokens(tiny_model, half_len=12, n_seqs=3, token_range=(1, 200), seed=3)
    T = tokens.shape[1]
    eye, prev = torch.eye(T), torch.diag(torch.ones(T - 1), -1)
    prev[0, 0] = 1.0
    induction = interp.heads.target_mask(tokens, "induction").float()
    rows = induction.sum(-1, keepdim=True)
    induction = torch.where(rows > 0, induction / rows.clamp(min=1), eye)  # uniform over targets, else self

    def layer0(p):
        p = p.clone()
        p[:, 0] = 0.5 * prev + 0.5 * eye  # half on the previous token
        p[:, 1] = prev
        return p

    def layer1(p):
        p = p.clone()
        p[:, 2] = induction
        return p

    tiny_model.add_hook("blocks.0.attn.hook_pattern", _force(layer0))
    tiny_model.add_hook("blocks.1.attn.hook_pattern", _force(layer1))
    try:
        prev_s = interp.head_scores(tiny_model, "previous_token", tokens).set_index(["layer", "head"]).score
        ind_s = interp.head_scores(tiny_model, "induction", tokens).set_index(["layer", "head"]).score
    finally:
        tiny_model.reset_hooks()
    assert prev_s[(0, 0)] == pytest.approx(0.5, abs=1e-6)
    assert prev_s[(0, 1)] == pytest.approx(1.0, abs=1e-6)
    assert ind_s[(1, 2)] == pytest.approx(1.0, abs=1e-6)
    assert ind_s[(0, 1)] < 0.1


@pytest.mark.parametrize("ours, theirs", [("previous_token", "previous_token_head"),
                                          ("duplicate_token", "duplicate_token_head"),
                                          ("prefix_matching", "induction_head"),
                                          ("induction", "induction_head")])
def test_agrees_with_transformer_lens_detect_head(tiny_model, ours, theirs):
    g = torch.Generator().manual_seed(0)
    half = torch.randperm(255, generator=g)[:20] + 1
    sequences = [torch.cat([half, half])]  # repeated, no accidental repeats: induction == prefix matching
    if ours != "induction":  # with accidental repeats too (ids from 1..11)
        sequences.append(torch.randint(1, 12, (40,), generator=g))
    for seq in sequences:
        mine, n_rows = interp.heads.head_score_tensor(tiny_model, ours, seq[None])
        tl = detect_head(tiny_model, seq, theirs)
        # detect_head divides the attention on the targets by seq_len, we by the rows that have a target
        assert torch.allclose(mine * n_rows / len(seq), tl, atol=1e-5)


def test_repeated_tokens_and_bad_input(tiny_model):
    t = interp.repeated_tokens(tiny_model, half_len=10, n_seqs=3, token_range=(5, 9), seed=1)
    assert t.shape == (3, 20) and torch.equal(t[:, :10], t[:, 10:]) and t.min() >= 5 and t.max() < 9
    assert torch.equal(t, interp.repeated_tokens(tiny_model, half_len=10, n_seqs=3, token_range=(5, 9), seed=1))
    with pytest.raises(ValueError, match="token_range"):
        interp.repeated_tokens(tiny_model, token_range=(0, 999))
    with pytest.raises(ValueError, match="context"):
        interp.repeated_tokens(tiny_model, half_len=40)
    with pytest.raises(ValueError, match="no query position"):
        interp.head_scores(tiny_model, "duplicate_token", torch.arange(1, 30))


def test_walkthrough_gpt_runs_unchanged():
    from sprout.walkthrough import build_step

    torch.manual_seed(0)
    model = build_step("4.10", context=32).eval()
    seq = torch.randint(0, 65, (24,), generator=torch.Generator().manual_seed(0))
    mine, n_rows = interp.heads.head_score_tensor(model, "previous_token", seq[None])
    assert torch.allclose(mine * n_rows / len(seq), detect_head(model, seq, "previous_token_head"), atol=1e-5)
    df = interp.head_scores(model, "induction", half_len=8, n_seqs=2, token_range=(0, 65))
    assert len(df) == 3 * 4 and df.score.between(0, 1).all()


def test_default_half_len_clipped_to_a_short_context():
    """On a context-32 Sprout the default 32-token half is clipped to 16: the scores equal those measured
    with half_len=16 explicitly, and ablate_heads' default works too."""
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=64, context=32, n_layer=1, n_head=2, d_model=32, d_ff=64))
    default = interp.head_scores(model, "induction", n_seqs=2)
    explicit = interp.head_scores(model, "induction", half_len=16, n_seqs=2)
    assert default.equals(explicit)
    assert int(default["n_rows"].iloc[0]) >= 2 * 15  # at least second-copy positions 17..31 of each sequence
    with pytest.raises(ValueError, match="half_len"):
        interp.repeated_tokens(model, 17)  # an explicit half too long for the context is still an error
    assert len(interp.ablate_heads(model, [(0, 0)], n_seqs=2)) == 1
