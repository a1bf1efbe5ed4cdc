"""finetune_kl: an exact dictionary is spliced without changing the model (KL 0), fine-tuning lowers the spliced
model's KL measured by hand-written hooks, the model and the dictionary given are left as they were, the
sparsity holds, and bad settings are refused by name."""
import pytest
import torch
import torch.nn.functional as F

import interp
from interp.saes.convert import to_jumprelu
from interp.saes.settings import SettingsError
from interp.saes.training.finetune import finetune_kl
from sprout import Sprout
from sprout.walkthrough import WalkthroughConfig, WalkthroughGPT
from tests.conftest import TINY, randomize_gains


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = randomize_gains(Sprout(TINY).eval())
    with torch.no_grad():  # block 1's MLP made to matter: a random model's next-token guess barely reads it
        model.blocks[1].ffn.w2.weight.mul_(30.0)
    return model


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def transcoder(model, ids):
    return interp.train_transcoder(model, ids, 1, kind="batchtopk", d_sae=64, k=4, steps=30, batch_size=128,
                                   progress=False, buffer_tokens=512)


def _kl(model, sae, ids):
    """KL(clean || spliced) per token, the dictionary run by hand at inference (its threshold)."""
    seen = {}

    def read(x, hook):
        seen["x"] = x

    def write(y, hook):
        x = seen.pop("x")
        skip = x @ sae.W_skip.T if getattr(sae, "skip", False) else 0
        return sae.decode(sae.encode(x)) + skip

    out = sae.hook_name_out if isinstance(sae, interp.Transcoder) else sae.hook_name
    with torch.no_grad():
        clean = model(ids).log_softmax(-1)
        spliced = model.run_with_hooks(ids, fwd_hooks=[(sae.hook_name, read), (out, write)]).log_softmax(-1)
    return F.kl_div(spliced.flatten(0, 1), clean.flatten(0, 1), log_target=True, reduction="batchmean").item()


def _walkthrough():
    torch.manual_seed(1)
    return WalkthroughGPT(WalkthroughConfig(vocab_size=256, context=64, d_model=32, n_head=2, n_layer=2, dropout=0.0)).eval()


@pytest.mark.parametrize("which, hook", [("sprout", "blocks.0.hook_resid_post"), ("sprout", "blocks.1.hook_resid_mid"),
                                         ("walkthrough", "blocks.1.hook_resid_mid")])
def test_an_exact_dictionary_splices_in_with_no_kl(model, ids, which, hook):
    """The fine-tuner's spliced pass (from the dictionary's block on) is the model's own when the dictionary is exact."""
    net = model if which == "sprout" else _walkthrough()
    d = int(net.cfg.d_model)  # relu(x) - relu(-x) = x: at most d of the 2d latents fire, so TopK with k = d is exact
    sae = interp.SAE(d, 2 * d, kind="topk", k=d, hook_name=hook)
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    tuned = finetune_kl(net, sae, ids, steps=3, batch_windows=4, lr=1e-6, progress=False)
    record = tuned.info["kl_finetune"]
    assert record["first_batch"]["kl"] < 1e-6 and record["first_batch"]["fvu"] < 1e-10
    assert _kl(net, tuned, ids) < 1e-5


def test_fine_tuning_lowers_the_spliced_models_kl(model, ids, transcoder):
    before_model = {k: v.clone() for k, v in model.state_dict().items()}
    before_tc = {k: v.clone() for k, v in transcoder.state_dict().items()}
    tuned = finetune_kl(model, transcoder, ids, steps=60, batch_windows=8, lr=1e-3, progress=False)
    assert _kl(model, tuned, ids) < 0.8 * _kl(model, transcoder, ids)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before_model.items())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, transcoder.state_dict()[k]) for k, v in before_tc.items())
    assert tuned is not transcoder and not tuned.training and tuned.kind == "batchtopk"
    with torch.no_grad():  # the sparsity holds: the moved threshold keeps about k latents a token
        _, cache = model.run_with_cache(ids, names_filter=tuned.hook_name)
        l0 = (tuned.encode(cache[tuned.hook_name]) > 0).sum(-1).float().mean().item()
    assert 2 <= l0 <= 6, l0
    assert tuned.info["kl_finetune"]["steps"] == 60 and tuned.info["settings"] == transcoder.info["settings"]


def test_the_reconstruction_term_keeps_the_output_nearer_the_mlps(model, ids, transcoder):
    """mse_coefficient weighs the reconstruction: with it the fine-tuned output stays nearer the MLP's."""
    with_mse = finetune_kl(model, transcoder, ids, steps=60, batch_windows=8, lr=1e-3, mse_coefficient=10.0, progress=False)
    kl_only = finetune_kl(model, transcoder, ids, steps=60, batch_windows=8, lr=1e-3, mse_coefficient=0.0, progress=False)
    assert with_mse.info["kl_finetune"]["last_batch"]["fvu"] < kl_only.info["kl_finetune"]["last_batch"]["fvu"]


@pytest.mark.parametrize("kw, field", [
    (dict(steps=0), "steps"), (dict(lr=-1.0), "lr"), (dict(mse_coefficient=-0.5), "mse_coefficient"),
    (dict(threshold_lr=2.0), "threshold_lr"), (dict(batch_windows=0), "batch_windows"), (dict(progress="no"), "progress"),
])
def test_bad_settings_refused_by_field(model, ids, transcoder, kw, field):
    with pytest.raises(SettingsError, match=field):
        finetune_kl(model, transcoder, ids, **kw)


def test_a_dictionary_outside_the_blocks_is_refused_by_its_hook(model, ids):
    sae = interp.SAE(TINY.d_model, 32, kind="topk", k=2, hook_name="hook_embed")
    with pytest.raises(SettingsError, match="'hook_embed'"):
        finetune_kl(model, sae, ids, steps=2)


def test_a_jumprelu_dictionary_is_refused_with_the_way_out(model, ids, transcoder):
    with pytest.raises(SettingsError, match="before to_jumprelu"):
        finetune_kl(model, to_jumprelu(transcoder), ids, steps=2)
