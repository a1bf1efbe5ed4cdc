"""The RoPE check: scores depend only on m - n, rotations keep lengths."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import interp
from sprout import SproutConfig


def test_chapter_pairs():
    df = interp.rope_distance_check()
    assert df.distance.tolist() == [3, 3, 3, 1]
    same = df[df.distance == 3].score
    scale = 64.0  # |q| |k| ~ d_head for standard normal vectors
    assert same.max() - same.min() < 1e-4 * scale  # float32 RoPE tables: angles of up to 400 rad
    assert abs(df.score[3] - df.score[0]) > 1e-2 * scale  # another distance, another score
    assert df.norm_ratio.tolist() == pytest.approx([1.0] * 4, abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 200), st.integers(0, 200), st.integers(0, 300), st.integers(0, 10**6))
def test_score_depends_only_on_distance(m, n, shift, seed):
    cfg = SproutConfig(context=512, n_head=4, d_model=64)  # d_head 16
    df = interp.rope_distance_check(cfg, [(m, n), (m + shift, n + shift)], seed=seed)
    assert df.score[0] == pytest.approx(df.score[1], abs=2e-4 * 16)


def test_given_vectors_and_bad_positions():
    q = torch.zeros(64)
    q[0] = 1.0
    df = interp.rope_distance_check(positions=[(3, 3), (7, 7)], q=q, k=q)
    assert df.score.tolist() == pytest.approx([1.0, 1.0])  # same position: no relative rotation
    with pytest.raises(ValueError, match="outside the RoPE table"):
        interp.rope_distance_check(positions=[(600, 2)])
    with pytest.raises(ValueError, match="d_head"):
        interp.rope_distance_check(q=torch.zeros(8), k=torch.zeros(8))
