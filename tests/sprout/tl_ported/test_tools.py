"""TransformerLens' tests of its tools that apply to any model: tests/unit/test_patching.py,
test_svd_interpreter.py (its refusals; its expected singular vectors are solu-2l's pretrained weights, so
the values are checked against a dense SVD instead), test_split_qkv.py and test_use_attn_result.py (normal
attention; the grouped-query halves do not apply: Sprout has n_key_value_heads = n_heads),
tests/integration/test_cross_entropy_loss.py, test_head_detector.py (its expected scores are solu-2l's;
here a hook pins each head's pattern, so the scores are known exactly) and TransformerLens 4.3's edge
attribution patching (tools.analysis.attribution_patching), which reads `blocks.{l}.attn.hook_q_input`."""
import pytest
import torch
from transformer_lens import SVDInterpreter
from transformer_lens.head_detector import detect_head
from transformer_lens.patching import get_act_patch_attn_head_all_pos_every
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

from sprout import Sprout, SproutConfig
from sprout.tokenizer import char_tokenizer
from tests.conftest import needs_tl4, randomize_gains

CLEAN = torch.tensor([[5, 9, 2, 11, 4, 7]])
CORRUPT = torch.tensor([[5, 9, 3, 11, 4, 7]])


def last_logits(logits):
    return logits[:, -1, :].sum()


def test_act_patch_attn_head_all_pos_every_shape_and_values(small):
    _, clean_cache = small.run_with_cache(CLEAN)
    result = get_act_patch_attn_head_all_pos_every(small, CORRUPT, clean_cache, last_logits)
    assert result.shape == (5, small.cfg.n_layers, small.cfg.n_heads)
    assert not torch.all(result == result[0, 0, 0]), "all patch results are identical"
    assert torch.isfinite(result).all()


# --- SVDInterpreter --------------------------------------------------------------------------------------

def test_svd_interpreter_matches_a_dense_svd(small):
    svd = SVDInterpreter(small)
    ov = svd.get_singular_vectors("OV", layer_index=1, num_vectors=4, head_index=1)
    _, _, Vh = torch.linalg.svd(small.OV[1, 1].AB)
    want = small.W_U.T @ Vh[:4].T  # the right singular vectors read out in the vocabulary (up to sign)
    assert ov.shape == (small.cfg.d_vocab, 1, 4)
    torch.testing.assert_close(ov[:, 0].abs(), want.abs(), atol=1e-4, rtol=0)
    w_out = svd.get_singular_vectors("w_out", layer_index=0, num_vectors=3)
    _, _, Vh = torch.linalg.svd(small.W_out[0])
    torch.testing.assert_close(w_out[:, 0].abs(), (small.W_U.T @ Vh[:3].T).abs(), atol=1e-4, rtol=0)


def test_svd_interpreter_refusals(small):
    svd = SVDInterpreter(small)
    with pytest.raises(AssertionError, match="Head index optional only for w_in and w_out, got OV"):
        svd.get_singular_vectors("OV", layer_index=0, num_vectors=4)
    for vector in ("OV", "w_in", "w_out"):
        with pytest.raises(AssertionError, match="Layer index must be between 0 and 2 but got 3"):
            svd.get_singular_vectors(vector, layer_index=3, num_vectors=4, head_index=0)
    with pytest.raises(AssertionError, match="Head index must be between 0 and 1 but got 2"):
        svd.get_singular_vectors("OV", layer_index=0, num_vectors=4, head_index=2)
    with pytest.raises(ValueError, match="Vector type must be in"):
        svd.get_singular_vectors("test", layer_index=0, num_vectors=4, head_index=0)


# --- flags: split qkv input, attn result ---------------------------------------------------------------------

def test_split_qkv_normal_attn_correct(small):
    x = torch.arange(1, 9).unsqueeze(0)
    normal = small(x, return_type="logits")
    small.set_use_split_qkv_input(True)
    try:
        names = ["blocks.0.hook_q_input", "blocks.0.hook_k_input", "blocks.0.hook_v_input"]
        split, cache = small.run_with_cache(x, names_filter=names)
    finally:
        small.set_use_split_qkv_input(False)
    for name in names:
        assert name in cache and cache[name].shape[2] == small.cfg.n_heads
    assert torch.allclose(normal, split, atol=1e-6)


def test_attn_result_normal_attn_correct(small):
    x = torch.arange(1, 9).unsqueeze(0)
    normal = small(x, return_type="logits")
    small.set_use_attn_result(True)
    try:
        split, cache = small.run_with_cache(x)
    finally:
        small.set_use_attn_result(False)
    assert torch.allclose(normal, split, atol=1e-6)
    result = cache["blocks.0.attn.hook_result"]
    assert result.shape == (1, 8, small.cfg.n_heads, small.cfg.d_model)
    assert torch.allclose(result.sum(dim=2) + small.blocks[0].attn.b_O, cache["blocks.0.hook_attn_out"], atol=1e-5)


# --- loss with an attention mask -----------------------------------------------------------------------------

def test_cross_entropy_attention_mask(small):
    """Masked tokens appended to the input do not change the loss."""
    tokens = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(5))
    ones = torch.ones_like(tokens)
    loss = small(tokens, return_type="loss")
    assert torch.allclose(loss, small(tokens, attention_mask=ones, return_type="loss"), atol=1e-6)
    extra = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(6))
    combined = torch.cat([tokens, extra], dim=1)
    mask = torch.cat([ones, torch.zeros_like(extra)], dim=1)
    assert torch.allclose(loss, small(combined, attention_mask=mask, return_type="loss"))


# --- head detector -------------------------------------------------------------------------------------------

CHARS = "abcdefgh "


@pytest.fixture
def pinned():
    """A char-level Sprout whose head L0H0 is a perfect previous-token head and L1H1 attends to itself."""
    torch.manual_seed(0)
    cfg = SproutConfig(vocab_size=len(CHARS), context=32, n_layer=2, n_head=2, d_model=16, d_ff=32)
    model = randomize_gains(Sprout(cfg, tokenizer=char_tokenizer(CHARS)).eval())

    def pin(kind):
        def hook(pattern, hook):
            T = pattern.shape[-1]
            want = torch.eye(T).roll(-1, dims=1).tril() if kind == "prev" else torch.eye(T)
            if kind == "prev":
                want[0, 0] = 1.0  # the first token can only attend to itself
            pattern[:, 0 if kind == "prev" else 1] = want
            return pattern
        return hook

    model.add_perma_hook("blocks.0.attn.hook_pattern", pin("prev"))
    model.add_perma_hook("blocks.1.attn.hook_pattern", pin("self"))
    yield model
    model.reset_hooks(including_permanent=True)


def test_detect_head_scores_pinned_heads_exactly(pinned):
    seq = "abcdefgh"
    prev = detect_head(pinned, seq, "previous_token_head")
    assert prev.shape == (2, 2)
    # error_measure "mul": the share of each row's attention on the detection pattern, averaged over rows
    assert prev[0, 0].item() == pytest.approx(7 / 8)  # row 0 has no previous token (TL's pattern is zero there)
    dup = detect_head(pinned, seq, "previous_token_head", exclude_bos=True)
    assert dup[0, 0].item() == pytest.approx(1.0)
    current = detect_head(pinned, seq, torch.eye(len(seq)))
    assert current[1, 1].item() == pytest.approx(1.0)
    # the same scores from a cache passed in
    _, cache = pinned.run_with_cache(seq, remove_batch_dim=True)  # TL's detect_head reads [head, pos, pos]
    torch.testing.assert_close(detect_head(pinned, seq, "previous_token_head", cache=cache), prev)


def test_detect_head_refusals(pinned):
    with pytest.raises((ValueError, AssertionError)):
        detect_head(pinned, "abc", "test")
    with pytest.raises((ValueError, AssertionError)):
        detect_head(pinned, "abcabc", torch.ones(4, 4))  # not [pos, pos]


# --- TransformerLens 4.3's edge attribution patching ----------------------------------------------------------

@needs_tl4
def test_edge_attribution_patching_runs_and_its_edges_sum_to_the_node_scores(small):
    clean, corrupt = CLEAN.repeat(2, 1), CORRUPT.repeat(2, 1)
    metric = lambda logits: logits[0, -1, 3] - logits[0, -1, 4]  # noqa: E731
    flags = dict(small.cfg.__dict__)
    edges = attribution_patch(small, clean, corrupt, metric, EdgeAttributionConfig(granularity="edge"))
    nodes = attribution_patch(small, clean, corrupt, metric)
    assert {k: small.cfg.__dict__[k] for k in flags if k.startswith("use_")} == \
        {k: v for k, v in flags.items() if k.startswith("use_")}  # the flags it set are restored
    assert not any(".attn.hook_q_input" in n for n in small.hook_dict)  # so are the aliases
    readers = {kind for _, reader in edges.edge_scores for kind in [reader.kind]}
    assert {"q_input", "k_input", "v_input", "mlp_in", "logits"} <= readers
    total = {}
    for (writer, _), score in edges.edge_scores.items():
        total[writer] = total.get(writer, 0.0) + score
    for node, score in nodes.node_scores.items():
        assert total[node] == pytest.approx(score, abs=1e-5), node
