"""Attention patterns: causal rows that sum to 1, the long table matches the tensor, selections."""
import pytest
import torch

import interp


def test_pattern_tensor_matches_the_cache_and_is_causal(tiny_model):
    ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(0))
    p = interp.heads.pattern_tensor(tiny_model, ids)
    assert p.shape == (2, 4, 12, 12)
    _, cache = tiny_model.run_with_cache(ids[None])
    assert torch.allclose(p[1], cache["blocks.1.attn.hook_pattern"][0], atol=1e-6)  # a full cache takes the materialised path
    assert torch.allclose(p.sum(-1), torch.ones(2, 4, 12), atol=1e-6)
    assert (p.triu(1) == 0).all()


def test_long_table_matches_the_tensor(tiny_model):
    ids = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(1))
    df = interp.attention_patterns(tiny_model, ids, layer=1, head=[0, 3])
    p = interp.heads.pattern_tensor(tiny_model, ids, layer=1, head=[0, 3])
    assert p.shape == (1, 2, 9, 9)
    assert len(df) == 2 * 9 * 10 // 2  # the causal half, diagonal included
    assert (df.key_pos <= df.query_pos).all()
    for j, h in enumerate((0, 3)):
        sub = df[df["head"] == h]
        assert (sub.layer == 1).all()
        assert torch.allclose(torch.tensor(sub.weight.tolist()), p[0, j][sub.query_pos.tolist(), sub.key_pos.tolist()])
    assert df.query_token.iloc[-1] == f"#{ids[-1].item()}" and df.key_token.iloc[0] == f"#{ids[0].item()}"


def test_selection_errors_are_named(tiny_model):
    with pytest.raises(ValueError, match=r"layer 2 is out of range.*2 layers"):
        interp.attention_patterns(tiny_model, torch.arange(5), layer=2)
    with pytest.raises(ValueError, match="one sequence"):
        interp.heads.pattern_tensor(tiny_model, torch.zeros(2, 5, dtype=torch.long))
