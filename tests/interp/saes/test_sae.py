"""Each kind's encode / decode / training rule against a hand-written computation on the same weights."""
import pytest
import torch

import interp
from interp.saes.kinds import KIND_NAMES

torch.manual_seed(0)
D_IN, D_SAE, K = 12, 40, 5


def _random(kind, **kw):
    k = K if kind in ("topk", "batchtopk", "matryoshka") else None
    sae = interp.SAE(D_IN, D_SAE, kind=kind, k=k, hook_name="blocks.0.hook_resid_post", seed=3, **kw)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (sae.W_enc, sae.b_enc, sae.b_dec):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if sae.threshold is not None:
            sae.threshold.copy_(torch.rand(D_SAE, generator=g) * 0.6)
    return sae


def _pre(sae, x):
    return (x - sae.b_dec) @ sae.W_enc + sae.b_enc


def _topk_by_sorting(pre, k):
    out = torch.zeros_like(pre)
    for row in range(pre.shape[0]):
        order = sorted(range(pre.shape[1]), key=lambda j: -float(pre[row, j]))[:k]
        for j in order:
            out[row, j] = max(float(pre[row, j]), 0.0)
    return out


def _hand_encode(sae, x):
    pre = _pre(sae, x).detach()
    if sae.kind == "relu":
        return torch.where(pre > 0, pre, torch.zeros_like(pre))
    if sae.kind == "topk":
        return _topk_by_sorting(pre, sae.k)
    # JumpReLU, and BatchTopK / Matryoshka at inference: a unit fires above its threshold
    return torch.where((pre > sae.threshold) & (pre > 0), pre, torch.zeros_like(pre))


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_encode_decode_forward_equal_hand_written(kind):
    sae = _random(kind)
    x = torch.randn(7, D_IN)
    acts = sae.encode(x)
    want = _hand_encode(sae, x)
    assert torch.allclose(acts, want, atol=1e-6)
    assert torch.allclose(sae.decode(acts), want @ sae.W_dec + sae.b_dec, atol=1e-5)
    assert torch.allclose(sae(x), want @ sae.W_dec + sae.b_dec, atol=1e-5)
    x3 = torch.randn(2, 3, D_IN)  # leading axes pass through
    assert torch.allclose(sae.encode(x3).reshape(6, D_SAE), sae.encode(x3.reshape(6, D_IN)), atol=1e-6)


def test_attributes_and_shapes():
    sae = interp.SAE(D_IN, D_SAE, kind="jumprelu", hook_name="blocks.1.hook_resid_pre")
    assert sae.W_enc.shape == (D_IN, D_SAE) and sae.W_dec.shape == (D_SAE, D_IN)
    assert sae.b_enc.shape == (D_SAE,) and sae.b_dec.shape == (D_IN,) and sae.threshold.shape == (D_SAE,)
    assert sae.hook_name == "blocks.1.hook_resid_pre" and sae.k is None
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(D_SAE))  # unit decoder rows from the start
    assert interp.SAE(D_IN, D_SAE, kind="topk", k=3).threshold is None


def test_topk_keeps_k_per_row():
    sae = _random("topk")
    assert ((sae.encode(torch.randn(50, D_IN)) != 0).sum(-1) <= K).all()


def test_batchtopk_training_keeps_k_times_batch_over_the_batch():
    sae = _random("batchtopk")
    x = torch.randn(30, D_IN)
    pre = _pre(sae, x)
    acts = sae.rule.train_acts(pre, sae, 30)
    relu = pre.clamp_min(0).reshape(-1)
    keep = relu.sort(descending=True).values[K * 30 - 1]
    want = torch.where(pre.clamp_min(0) >= keep, pre.clamp_min(0), torch.zeros_like(pre))
    assert int((acts > 0).sum()) == K * 30
    assert torch.allclose(acts, want)
    assert not ((acts > 0).sum(-1) == K).all()  # per row it varies: that is the point of BatchTopK


def test_batchtopk_threshold_moves_toward_smallest_kept_latent():
    sae = _random("batchtopk")
    with torch.no_grad():
        sae.threshold.zero_()
    first, second = (sae.rule.train_acts(_pre(sae, torch.randn(30, D_IN)), sae, 30).detach() for _ in range(2))
    sae.rule.after_step(first, sae, 0.25)  # the first update starts at the batch's value
    assert torch.allclose(sae.threshold, torch.full((D_SAE,), float(first[first > 0].min())))
    sae.rule.after_step(second, sae, 0.25)
    want = 0.75 * float(first[first > 0].min()) + 0.25 * float(second[second > 0].min())
    assert torch.allclose(sae.threshold, torch.full((D_SAE,), want))


def test_matryoshka_loss_is_the_mean_of_its_prefix_losses():
    sae = _random("matryoshka", widths=[5, 20, D_SAE])
    x = torch.randn(9, D_IN)
    acts = sae.rule.train_acts(_pre(sae, x), sae, 9)
    hand = sum(((acts[:, :m] @ sae.W_dec[:m] + sae.b_dec - x) ** 2).sum(-1) for m in (5, 20, D_SAE)) / 3
    assert torch.allclose(sae.rule.reconstruction(x, acts, sae, None), hand, atol=1e-5)


def test_jumprelu_straight_through_gradients():
    """Rajamanoharan et al. 2024: d/dt of z H(z - t) is -(t / eps) K((z - t) / eps); of H(z - t), -(1 / eps) K(.)."""
    sae = _random("jumprelu", bandwidth=0.5)
    x = torch.randn(20, D_IN)
    pre = _pre(sae, x).detach().requires_grad_(True)
    t, eps = sae.threshold, 0.5
    kernel = ((pre - t).abs() < eps / 2).float()
    acts = sae.rule.train_acts(pre, sae, 20)
    acts.sum().backward()
    assert torch.allclose(t.grad, (-(t / eps) * kernel).sum(0).detach(), atol=1e-5)
    assert torch.allclose(pre.grad, (pre > t).float())
    t.grad = None
    sae.rule.penalty(pre, acts, sae).sum().backward()
    assert torch.allclose(t.grad, (-(1 / eps) * kernel).sum(0).detach(), atol=1e-5)


def test_decoder_gradient_projection_and_renormalisation():
    sae = _random("topk")
    sae.W_dec.grad = torch.randn(D_SAE, D_IN)
    sae.project_decoder_grad_()
    assert torch.allclose((sae.W_dec.grad * sae.W_dec).sum(-1), torch.zeros(D_SAE), atol=1e-5)
    with torch.no_grad():
        sae.W_dec.mul_(3)
    sae.normalize_decoder_()
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(D_SAE), atol=1e-6)


def test_fold_scale_gives_the_same_reconstruction_in_original_units():
    for kind in KIND_NAMES:
        sae = _random(kind)
        x = torch.randn(6, D_IN)
        scaled = sae(x * 2.5) / 2.5
        latents = sae.encode(x * 2.5) / 2.5
        sae.fold_scale_(2.5, 2.5)
        assert torch.allclose(sae(x), scaled, atol=1e-5), kind
        assert torch.allclose(sae.encode(x), latents, atol=1e-5), kind


def test_transcoder_with_skip_equals_hand_written():
    tc = interp.Transcoder(D_IN, D_SAE, 9, kind="relu", skip=True, layer=2)
    with torch.no_grad():
        tc.W_skip.copy_(torch.randn(9, D_IN))
        tc.b_dec.copy_(torch.randn(9))
    x = torch.randn(4, D_IN)
    acts = torch.relu(x @ tc.W_enc + tc.b_enc)  # b_dec lives in the output space: not subtracted
    assert torch.allclose(tc(x), acts @ tc.W_dec + tc.b_dec + x @ tc.W_skip.T, atol=1e-5)
    assert tc.hook_name == "blocks.2.ln2.hook_normalized" and tc.hook_name_out == "blocks.2.hook_mlp_out"
    assert tc.W_dec.shape == (D_SAE, 9) and tc.W_skip.shape == (9, D_IN) and tc.layer == 2


@pytest.mark.parametrize("kw, err", [
    (dict(kind="topk", k=D_SAE + 1), ValueError), (dict(kind="topk", k=2.0), TypeError),
    (dict(kind="topk", k="4"), TypeError), (dict(kind="topk", k=True), TypeError),
    (dict(kind="relu", k=3), ValueError), (dict(kind="gated"), ValueError),
    (dict(kind="matryoshka", k=2, widths=[10, 5, D_SAE]), ValueError),
])
def test_bad_arguments_are_refused_by_name(kw, err):
    with pytest.raises(err, match="k|kind|widths"):
        interp.SAE(D_IN, D_SAE, **kw)


@pytest.mark.parametrize("kind", ["topk", "batchtopk", "matryoshka"])
def test_k_defaults_to_32_or_every_latent_of_a_smaller_dictionary(kind):
    assert interp.SAE(D_IN, 64, kind=kind).k == 32 and interp.SAE(D_IN, 20, kind=kind).k == 20
    if kind == "topk":
        assert int((interp.SAE(D_IN, 64, kind=kind).encode(torch.randn(5, D_IN)) > 0).sum(-1).max()) <= 32
    assert interp.train_sae(torch.randn(300, D_IN), kind=kind, d_sae=40, steps=2, batch_size=100).k == 32


def test_wrong_width_is_refused_naming_the_hook():
    sae = interp.SAE(D_IN, D_SAE, kind="relu", hook_name="blocks.0.hook_resid_post")
    with pytest.raises(ValueError, match="d_in=12.*blocks.0.hook_resid_post"):
        sae.encode(torch.randn(3, D_IN + 1))
