"""train_sae / train_transcoder: harvesting equals the model's own cache, several hooks from one forward
equal separate runs, resume equals an uninterrupted run, and bad settings or data are refused by name."""
import math

import pytest
import torch

import interp
from interp.saes.settings import SettingsError
from interp.saes.training.harvest import ModelSource
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

H0, H1 = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
QUICK = dict(d_sae=32, steps=6, batch_size=128, progress=False, buffer_tokens=512)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (12, 64), generator=torch.Generator().manual_seed(3))


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_harvested_rows_are_the_models_activations(model, ids):
    src = ModelSource(model, ids, [H0, "blocks.1.ln2.hook_normalized"], 128, 0, None, 5, 512)
    _, cache = model.run_with_cache(ids)
    every = {h: cache[h].reshape(-1, cache[h].shape[-1]) for h in src.hooks}
    seen = []
    for step in (0, 3, 4):  # 512 tokens a block, 4 steps of 128: step 4 is a new block
        rows = src.batch(step)
        for h in src.hooks:
            assert rows[h].shape == (128, 64)
            # every harvested row is one of the model's activations at that hook
            d = torch.cdist(rows[h], every[h], compute_mode="donot_use_mm_for_euclid_dist")
            assert d.min(-1).values.max() < 1e-4
        seen.append(rows[H0])
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert torch.equal(src.batch(3)[H0], seen[1])  # a step's batch depends on the step alone


def test_harvest_stops_after_the_last_layer_needed(model, ids):
    def boom(*_):
        raise AssertionError("block 1 ran")

    handle = model.blocks[1].register_forward_hook(boom)
    try:
        interp.train_sae(model, H0, data=ids, kind="topk", k=4, **QUICK)
    finally:
        handle.remove()


def test_several_hooks_from_one_forward_equal_separate_runs(model, ids):
    both = interp.train_sae(model, [H0, H1], data=ids, kind="batchtopk", k=4, **QUICK)
    assert set(both) == {H0, H1}
    for h in (H0, H1):
        alone = interp.train_sae(model, h, data=ids, kind="batchtopk", k=4, **QUICK)
        assert _same(both[h], alone) and both[h].hook_name == h


@pytest.mark.parametrize("kind", ["topk", "jumprelu", "matryoshka"])
def test_resume_equals_uninterrupted(tmp_path, model, ids, kind):
    k = 4 if kind != "jumprelu" else 3
    run = dict(QUICK, steps=8, kind=kind, k=k, dead_tokens=256)  # AuxK engages within the run
    whole = interp.train_sae(model, H1, data=ids, **run)
    interp.train_sae(model, H1, data=ids, checkpoint=tmp_path / "ck", stop_at=5, **run)
    resumed = interp.train_sae(model, H1, data=ids, checkpoint=tmp_path / "ck", resume=True, **run)
    assert resumed.info["steps"] == 8
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="resume.*lr: checkpoint None, now 0.001"):
        interp.train_sae(model, H1, data=ids, checkpoint=tmp_path / "ck", resume=True, **{**run, "lr": 1e-3})
    with pytest.raises(FileExistsError, match="resume=True"):
        interp.train_sae(model, H1, data=ids, checkpoint=tmp_path / "ck", **run)
    with pytest.raises(ValueError, match="resume.*data fingerprint"):
        interp.train_sae(model, H1, data=ids[:6], checkpoint=tmp_path / "ck", resume=True, **run)


def test_transcoder_training_records_hooks_and_model(model, ids):
    tcs = interp.train_transcoder(model, ids, [0, 1], kind="topk", k=4, skip=True, **QUICK)
    tc = tcs[1]
    assert isinstance(tc, interp.Transcoder) and tc.skip and tc.W_skip.abs().sum() > 0
    assert (tc.hook_name, tc.hook_name_out) == ("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out")
    tc.check_model(model)
    _, cache = model.run_with_cache(ids[:2])
    out = tc(cache["blocks.1.ln2.hook_normalized"])
    assert out.shape == cache["blocks.1.hook_mlp_out"].shape
    with pytest.raises(ValueError, match="another model"):
        tc.check_model(randomize_gains(Sprout(TINY).eval(), seed=4))


def test_tensor_source_unit_norm_decoder_and_info():
    acts = torch.randn(1000, 16) * 7 + 3
    sae = interp.train_sae(acts, kind="relu", d_sae=24, steps=20, batch_size=100, progress=False,
                           sparsity_coefficient=0.5, grad_clip=0)
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(24), atol=1e-5)
    assert sae.info["steps"] == 20 and sae.info["settings"]["grad_clip"] == 0
    assert math.isfinite(sae.info["train_fvu"]) and sae.d_in == 16 and sae.d_sae == 24


@pytest.mark.parametrize("kw, field", [
    (dict(lr=-1e-3), "lr"), (dict(lr=0.0), "lr"), (dict(lr=float("nan")), "lr"), (dict(lr=float("inf")), "lr"),
    (dict(steps=10.0), "steps"), (dict(steps=0), "steps"), (dict(batch_size=64.5), "batch_size"),
    (dict(k=33), "k"), (dict(k=2.0), "k"), (dict(grad_clip=-1.0), "grad_clip"), (dict(seq_len=3.5), "seq_len"),
    (dict(warmup_steps="10"), "warmup_steps"), (dict(typo_option=1), "typo_option"),
    (dict(b_dec_init="median"), "b_dec_init"), (dict(kind="topk", widths=[8, 32]), "widths"),
])
def test_bad_settings_refused_by_field(kw, field):
    run = dict(kind="topk", k=4, d_sae=32, steps=3, batch_size=64, progress=False)
    run.update(kw)
    with pytest.raises(SettingsError, match=field):
        interp.train_sae(torch.randn(256, 8), **run)


def test_bad_data_refused(model, ids):
    with pytest.raises(ValueError, match="no hook point 'blocks.5.hook_resid_post'"):
        interp.train_sae(model, "blocks.5.hook_resid_post", data=ids, kind="topk", k=4, **QUICK)
    with pytest.raises(ValueError, match="needs data"):
        interp.train_sae(model, H0, kind="topk", k=4, **QUICK)
    with pytest.raises(ValueError, match="no texts"):
        interp.train_sae(model, H0, data=[], kind="topk", k=4, **QUICK)
    with pytest.raises(ValueError, match="empty"):
        interp.train_sae(torch.zeros(0, 8), kind="topk", k=4, **QUICK)
    bad = torch.randn(256, 8)
    bad[17, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN.*row 17"):
        interp.train_sae(bad, kind="topk", k=4, **QUICK)
    with pytest.raises(TypeError, match="floating point"):
        interp.train_sae(torch.ones(256, 8, dtype=torch.long), kind="topk", k=4, **QUICK)
    with pytest.raises(ValueError, match="layer"):
        interp.train_transcoder(model, ids, 2, kind="topk", k=4, **QUICK)
    with pytest.raises(ValueError, match="blocks.0.attn.hook_z.*batch, pos, d"):
        interp.train_sae(model, "blocks.0.attn.hook_z", data=ids, kind="topk", k=4, **QUICK)


def test_walkthrough_gpt(ids):
    from sprout.walkthrough import WalkthroughConfig, WalkthroughGPT

    torch.manual_seed(1)
    gpt = WalkthroughGPT(WalkthroughConfig(vocab_size=256, context=64, d_model=32, n_head=2, n_layer=2, dropout=0.0)).eval()
    sae = interp.train_sae(gpt, "blocks.1.hook_resid_mid", data=ids, kind="topk", k=4, **QUICK)
    tc = interp.train_transcoder(gpt, ids, 0, kind="relu", **QUICK)
    assert sae.d_in == 32 and tc.d_out == 32
    sae.check_model(gpt)
    tc.check_model(gpt)


@pytest.mark.parametrize("transcoder", [False, True])
def test_sparse_topk_step_equals_the_dense_computation(transcoder):
    # training decodes TopK latents sparsely and folds b_dec into the encoder's bias (interp/saes/training/train.py):
    # the loss and every gradient must be those of the dense formulas, (x - b_dec) W_enc + b_enc, acts @ W_dec
    from interp.saes.training.train import _latents
    torch.manual_seed(0)
    cls = interp.Transcoder if transcoder else interp.SAE
    sae = cls(24, 96, kind="topk", k=5, **({"skip": False} if transcoder else {}))
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, target = torch.randn(40, 24), torch.randn(40, 24)

    def grads(loss):
        sae.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in sae.parameters()]

    pre, recon, acts, counts = _latents(sae, x, 40)
    assert acts is None  # the sparse path
    sparse = grads((recon - target).pow(2).sum())
    b_in = sae.b_dec if sae.apply_b_dec_to_input else torch.zeros(24)
    pre_dense = (x - b_in) @ sae.W_enc + sae.b_enc
    values, idx = pre_dense.topk(5, dim=-1)
    dense_acts = torch.zeros_like(pre_dense).scatter(-1, idx, values.relu())
    dense = grads((dense_acts @ sae.W_dec + sae.b_dec - target).pow(2).sum())
    assert torch.allclose(pre, pre_dense, atol=1e-5)
    assert torch.equal(counts, (dense_acts > 0).sum(0).to(counts.dtype))
    for a, b in zip(sparse, dense):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
