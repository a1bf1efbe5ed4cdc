"""Splicing dictionaries into the forward: equal to hand-written hooks; latents are hook points of the model."""
import pytest
import torch

import interp
from interp.saes.splice import spliced

RESID = "blocks.0.hook_resid_post"
LN2, MLP_OUT = "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"


class HandSAE(torch.nn.Module):
    """An SAE written out by hand (ReLU of an affine map, affine decoder), independent of interp.SAE."""

    def __init__(self, d_in, d_sae, hook_name, hook_name_out=None, d_out=None, seed=1):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        d_out = d_out or d_in
        self.W_enc = torch.nn.Parameter(torch.randn(d_in, d_sae, generator=g) / d_in ** 0.5)
        self.b_enc = torch.nn.Parameter(torch.randn(d_sae, generator=g) * 0.1 - 0.1)
        self.W_dec = torch.nn.Parameter(torch.randn(d_sae, d_out, generator=g) / d_sae ** 0.5)
        self.b_dec = torch.nn.Parameter(torch.randn(d_out, generator=g) * 0.1)
        self.hook_name, self.hook_name_out = hook_name, hook_name_out

    def encode(self, x):
        return torch.relu(x @ self.W_enc + self.b_enc)

    def decode(self, f):
        return f @ self.W_dec + self.b_dec


@pytest.fixture
def ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def sae(tiny_cfg):
    return HandSAE(tiny_cfg.d_model, 96, RESID)


@pytest.fixture
def transcoder(tiny_cfg):
    return HandSAE(tiny_cfg.d_model, 96, LN2, MLP_OUT)


def logits(model, ids, **kw):
    return model.run_with_hooks(ids, return_type="logits", **kw)


def test_splice_equals_hand_written_hook(tiny_model, sae, ids):
    hand = logits(tiny_model, ids, fwd_hooks=[(RESID, lambda x, hook: torch.relu(x @ sae.W_enc + sae.b_enc) @ sae.W_dec + sae.b_dec)])
    with torch.no_grad():
        ours, cache = interp.run_with_saes(tiny_model, ids, [sae], names_filter=[RESID, f"{RESID}.hook_sae_acts_post"])
        _, clean = tiny_model.run_with_cache(ids, names_filter=RESID)
    torch.testing.assert_close(ours, hand, rtol=0, atol=1e-5)
    assert not torch.allclose(ours, logits(tiny_model, ids), atol=1e-2)  # the splice does change the model
    # the cached latents are the hand-computed encoding of the clean activation
    torch.testing.assert_close(cache[f"{RESID}.hook_sae_acts_post"], torch.relu(clean[RESID] @ sae.W_enc + sae.b_enc))


def test_error_term_gives_the_clean_logits(tiny_model, sae, transcoder, ids):
    with torch.no_grad():
        clean = logits(tiny_model, ids)
        with spliced(tiny_model, [sae, transcoder], use_error_term=True):
            assert torch.equal(logits(tiny_model, ids), clean)  # nothing edited: bit for bit
        ours, cache = interp.run_with_saes(tiny_model, ids, [sae, transcoder], use_error_term=True)
    assert torch.equal(ours, clean)  # with the full cache too
    for name in (RESID, LN2):
        for point in ("hook_sae_input", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error", "hook_sae_output"):
            assert f"{name}.{point}" in cache
    torch.testing.assert_close(cache[f"{RESID}.hook_sae_recons"] + cache[f"{RESID}.hook_sae_error"], cache[RESID])
    torch.testing.assert_close(cache[f"{LN2}.hook_sae_recons"] + cache[f"{LN2}.hook_sae_error"], cache[MLP_OUT])


def test_transcoder_splice_equals_hand_written_hooks(tiny_model, transcoder, ids):
    seen = {}

    def read(x, hook):
        seen["x"] = x

    def write(out, hook):
        return transcoder.decode(transcoder.encode(seen["x"]))

    with torch.no_grad():
        hand = logits(tiny_model, ids, fwd_hooks=[(LN2, read), (MLP_OUT, write)])
        with spliced(tiny_model, transcoder):
            ours = logits(tiny_model, ids)
    torch.testing.assert_close(ours, hand, rtol=0, atol=1e-5)


def test_a_latent_edited_by_name_moves_the_output_by_its_decoder_row(tiny_model, sae, ids):
    latent, pos, value = 7, 5, 3.0

    def clamp(acts, hook):
        acts[:, pos, latent] = value

    def hand(x, hook):  # x + (f' - f) W_dec: the error term keeps everything the edit does not change
        f = torch.relu(x @ sae.W_enc + sae.b_enc)
        delta = value - f[:, pos, latent]
        x = x.clone()
        x[:, pos] += delta[:, None] * sae.W_dec[latent]
        return x

    with torch.no_grad():
        expected = logits(tiny_model, ids, fwd_hooks=[(RESID, hand)])
        with spliced(tiny_model, [sae], use_error_term=True):
            edited = logits(tiny_model, ids, fwd_hooks=[(f"{RESID}.hook_sae_acts_post", clamp)])
    torch.testing.assert_close(edited, expected, rtol=0, atol=1e-4)
    assert not torch.allclose(edited, logits(tiny_model, ids), atol=1e-3)


def test_gradients_reach_latents_through_the_decoder_and_upstream_as_the_clean_model(tiny_model, sae, ids):
    def grads(model):
        _, cache = model.run_with_cache(ids, return_type="loss", incl_bwd=True,
                                        names_filter=lambda n: n in (RESID, "blocks.0.hook_resid_pre") or n.endswith("acts_post"))
        return cache

    clean = grads(tiny_model)
    with spliced(tiny_model, [sae], use_error_term=True):
        ours = grads(tiny_model)
    torch.testing.assert_close(ours["blocks.0.hook_resid_pre_grad"], clean["blocks.0.hook_resid_pre_grad"])
    # d loss / d f = (d loss / d output) W_dec^T: the attribution of a latent is its decoder row's
    torch.testing.assert_close(ours[f"{RESID}.hook_sae_acts_post_grad"], clean[f"{RESID}_grad"] @ sae.W_dec.detach().T)


def test_latents_can_be_patched_like_any_activation(tiny_model, sae, ids):
    """Activation patching of one latent at one position (TransformerLens' denoising convention)."""
    corrupted = ids.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 1) % 256
    name = f"{RESID}.hook_sae_acts_post"
    with torch.no_grad(), spliced(tiny_model, [sae], use_error_term=True):
        _, clean_cache = tiny_model.run_with_cache(ids, names_filter=name)

        def put(acts, hook):
            acts[:, 3] = clean_cache[name][:, 3]

        patched = logits(tiny_model, corrupted, fwd_hooks=[(name, put)])
    # every latent at position 3 patched = the clean reconstruction there, plus the corrupted run's error
    with torch.no_grad():
        _, cc = tiny_model.run_with_cache(ids, names_filter=RESID)

        def hand(x, hook):
            f = torch.relu(x @ sae.W_enc + sae.b_enc)
            x = x.clone()
            x[:, 3] += (clean_cache[name][:, 3] - f[:, 3]) @ sae.W_dec
            return x

        expected = logits(tiny_model, corrupted, fwd_hooks=[(RESID, hand)])
    torch.testing.assert_close(patched, expected, rtol=0, atol=1e-4)


def test_the_model_is_left_as_it_was(tiny_model, sae, transcoder, ids):
    names, keys = list(tiny_model.hook_dict), list(tiny_model.state_dict())
    with spliced(tiny_model, [sae, transcoder]):
        assert f"{RESID}.hook_sae_acts_post" in tiny_model.hook_dict
        assert list(tiny_model.state_dict()) == keys  # the dictionaries' weights do not join the model's
    assert list(tiny_model.hook_dict) == names
    assert all(not p._forward_hooks for p in tiny_model.hook_dict.values())
    assert f"{RESID}.hook_sae_acts_post" not in tiny_model.mod_dict
    assert torch.equal(logits(tiny_model, ids), logits(tiny_model, ids, fwd_hooks=[(RESID, lambda x, hook: None)]))


def test_bad_splices_are_refused(tiny_model, sae, ids, tiny_cfg):
    with pytest.raises(ValueError, match="blocks.9.hook_resid_post"):
        with spliced(tiny_model, HandSAE(tiny_cfg.d_model, 8, "blocks.9.hook_resid_post")):
            pass
    with pytest.raises(ValueError, match="one dictionary per hook"):
        with spliced(tiny_model, [sae, HandSAE(tiny_cfg.d_model, 8, RESID)]):
            pass
    with pytest.raises(ValueError, match="d_in=32"):
        interp.run_with_saes(tiny_model, ids, HandSAE(32, 8, RESID))
    assert list(tiny_model.hook_dict) == [n for n in tiny_model.hook_dict if "sae" not in n]


def topk_by_hand(pre, k):
    values, idx = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, idx, values.relu())


def test_interp_sae_and_skip_transcoder_splice_as_written_by_hand(tiny_model, tiny_cfg, ids):
    d = tiny_cfg.d_model
    sae = interp.SAE(d, 128, kind="topk", k=8, hook_name=RESID, seed=2)
    tc = interp.Transcoder(d, 128, kind="topk", k=8, skip=True, layer=1, seed=3)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in (sae.b_enc, sae.b_dec, tc.b_enc, tc.b_dec, tc.W_skip):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    seen = {}

    def resid(x, hook):
        return topk_by_hand((x - sae.b_dec) @ sae.W_enc + sae.b_enc, 8) @ sae.W_dec + sae.b_dec

    def read(x, hook):
        seen["x"] = x

    def write(out, hook):
        x = seen["x"]
        return topk_by_hand(x @ tc.W_enc + tc.b_enc, 8) @ tc.W_dec + tc.b_dec + x @ tc.W_skip.T

    with torch.no_grad():
        hand = logits(tiny_model, ids, fwd_hooks=[(RESID, resid), (LN2, read), (MLP_OUT, write)])
        ours, cache = interp.run_with_saes(tiny_model, ids, [sae, tc])
    torch.testing.assert_close(ours, hand, rtol=0, atol=1e-5)
    assert (cache[f"{RESID}.hook_sae_acts_post"] != 0).sum(-1).max() == 8
    torch.testing.assert_close(cache[f"{LN2}.hook_sae_acts_pre"], cache[LN2] @ tc.W_enc + tc.b_enc)
