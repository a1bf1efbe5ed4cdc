"""Ablation through hook_z equals editing the weights: W_O's columns of the head zeroed."""
import copy

import pytest
import torch
import torch.nn.functional as F

import interp

HALF = 12


def _repeated_half_loss(model, tokens, fwd_hooks=()):
    """Mean loss of the predictions made inside the second copy (positions HALF .. 2 HALF - 2)."""
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks))
    lp = F.log_softmax(logits[:, HALF:-1].float(), -1)
    return -lp.gather(-1, tokens[:, HALF + 1:, None]).mean().item()


def _without_heads(model, heads):
    edited = copy.deepcopy(model)
    dh = model.cfg.d_head
    with torch.no_grad():
        for l, h in heads:
            edited.blocks[l].attn.proj.weight[:, h * dh:(h + 1) * dh] = 0.0
    return edited


def _data(model):
    return interp.repeated_tokens(model, half_len=HALF, n_seqs=6, seed=0)


def test_zero_ablation_equals_zeroed_output_columns(tiny_model):
    tokens = _data(tiny_model)
    df = interp.ablate_heads(tiny_model, [(0, 1), (1, 3)], half_len=HALF, n_seqs=6, batch_size=4)
    assert df.label.tolist() == ["L0H1", "L1H3", "L0H1+L1H3"]
    assert df.loss_clean.iloc[0] == pytest.approx(_repeated_half_loss(tiny_model, tokens), abs=1e-5)
    for row, heads in zip(df.itertuples(), ([(0, 1)], [(1, 3)], [(0, 1), (1, 3)])):
        expected = _repeated_half_loss(_without_heads(tiny_model, heads), tokens)
        assert row.loss_ablated == pytest.approx(expected, abs=1e-5), row.label
        assert row.delta == pytest.approx(expected - row.loss_clean, abs=1e-5)


def test_mean_ablation_equals_zeroed_columns_plus_the_mean_write(tiny_model):
    tokens = _data(tiny_model)
    _, cache = tiny_model.run_with_cache(tokens)
    z_mean = cache["blocks.1.attn.hook_z"][:, :, 2].reshape(-1, tiny_model.cfg.d_head).double().mean(0).float()
    dh = tiny_model.cfg.d_head
    mean_write = tiny_model.blocks[1].attn.proj.weight[:, 2 * dh:3 * dh] @ z_mean  # [d_model]
    add = [("blocks.1.hook_attn_out", lambda x, hook: x + mean_write)]
    expected = _repeated_half_loss(_without_heads(tiny_model, [(1, 2)]), tokens, add)
    df = interp.ablate_heads(tiny_model, [(1, 2)], method="mean", half_len=HALF, n_seqs=6)
    assert len(df) == 1 and df.method[0] == "mean"
    assert df.loss_ablated[0] == pytest.approx(expected, abs=1e-5)


def test_head_that_changes_nothing_is_flagged(tiny_model):
    dh = tiny_model.cfg.d_head
    with torch.no_grad():
        tiny_model.blocks[0].attn.proj.weight[:, :dh] = 0.0  # head 0.0 writes nothing
        tiny_model.blocks[1].attn.proj.weight[:, dh:2 * dh] *= 300.0  # head 1.1 writes a lot
    df = interp.ablate_heads(tiny_model, [(0, 0), (1, 1)], half_len=HALF, n_seqs=4, together=False)
    assert df.no_effect.tolist() == [True, False]
    assert df.delta[0] == pytest.approx(0.0, abs=1e-6)


def test_takes_the_top_k_of_a_head_scores_frame(tiny_model):
    scores = interp.head_scores(tiny_model, "induction", half_len=HALF, n_seqs=4)
    df = interp.ablate_heads(tiny_model, scores, top_k=2, half_len=HALF, n_seqs=4)
    assert list(zip(df.layer[:2], df["head"][:2])) == list(zip(scores.layer[:2], scores["head"][:2]))
    assert df.score[:2].tolist() == pytest.approx(scores.score[:2].tolist())
    assert df.layer[2] == -1 and df.label[2].count("+") == 1


def test_on_user_tokens_the_loss_covers_every_position(tiny_model):
    tokens = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(5))
    df = interp.ablate_heads(tiny_model, [(0, 2)], tokens)
    with torch.no_grad():
        loss = _without_heads(tiny_model, [(0, 2)])(tokens[:, :-1], return_type="loss", targets=tokens[:, 1:])
    assert df.loss_ablated[0] == pytest.approx(loss.item(), abs=1e-5)


def test_bad_input_is_named(tiny_model):
    with pytest.raises(ValueError, match="ablation method"):
        interp.ablate_heads(tiny_model, [(0, 0)], method="resample")
    with pytest.raises(ValueError, match=r"head 7 is out of range"):
        interp.ablate_heads(tiny_model, [(0, 7)])
    with pytest.raises(ValueError, match="no heads"):
        interp.ablate_heads(tiny_model, [])


def test_walkthrough_gpt_ablation_equals_zeroed_projection_columns():
    from sprout.walkthrough import build_step

    torch.manual_seed(0)
    model = build_step("4.10", context=32).eval()
    tokens = torch.randint(0, 65, (2, 20), generator=torch.Generator().manual_seed(1))
    edited = copy.deepcopy(model)
    dh = model.cfg.d_head
    with torch.no_grad():
        edited.blocks[1].attn.projection.weight[:, 2 * dh:3 * dh] = 0.0  # the bias stays, as in the hook
        loss = edited(tokens[:, :-1], return_type="loss", targets=tokens[:, 1:])
    df = interp.ablate_heads(model, [(1, 2)], tokens)
    assert df.loss_ablated[0] == pytest.approx(loss.item(), abs=1e-5)
