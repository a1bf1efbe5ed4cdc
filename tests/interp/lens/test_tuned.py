"""Tuned lens: zero translators are the logit lens, a hand computation agrees, training helps on held-out
text, save/load round-trips bit-exactly, and a lens for another model or bad input is refused clearly."""
import copy

import pytest
import torch
import torch.nn.functional as F

import interp
from interp._core.inputs import stream_windows
from interp._core.model import logits_of, unembed
from interp.data import model_text
from interp.lens._loss import Scratch, _UnembedCrossEntropy
from interp.lens.train import _frozen, lens_step
from sprout import Sprout
from sprout.files.checkpoint import load
from tests.conftest import TINY, randomize_gains


def ids_of(seed, shape=(4, 32)):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


def random_lens(model, seed=0, scale=0.05):
    lens = interp.TunedLens(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lens.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return lens


def test_zero_translators_reproduce_the_logit_lens_exactly(tiny_model):
    ids = ids_of(0, (3, 40))
    lens = interp.TunedLens(tiny_model)
    for stats in (False, True):
        a = interp.tuned_lens(tiny_model, ids, lens, k=4, batch_size=2, stats=stats)
        b = interp.logit_lens(tiny_model, ids, k=4, batch_size=2, stats=stats)
        pd_equal = a.columns.tolist() == b.columns.tolist() and a.equals(b)
        assert pd_equal
    cmp = interp.lens_comparison(tiny_model, ids, lens)
    logit, tuned = cmp[cmp.lens == "logit"].reset_index(drop=True), cmp[cmp.lens == "tuned"].reset_index(drop=True)
    assert logit.drop(columns="lens").equals(tuned.drop(columns="lens"))


def test_tuned_lens_matches_a_hand_computation_and_the_last_layer_is_the_output(tiny_model):
    ids = ids_of(1, (2, 24))
    lens = random_lens(tiny_model)
    df = interp.tuned_lens(tiny_model, ids, lens, k=3, stats=True)
    _, cache = tiny_model.run_with_cache(ids)
    with torch.no_grad():
        final = F.log_softmax(logits_of(tiny_model, ids).float(), -1)
        for i, name in enumerate(lens.sites):
            x = cache[name]
            if i < len(lens.translators):  # h + A h + b, written out by hand
                x = x + x @ lens.translators[i].weight.T + lens.translators[i].bias
            normed = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * tiny_model.norm.weight
            lp = F.log_softmax(normed @ tiny_model.embed.weight.T, -1)
            rows = df[df.layer == lens.layers[i]].sort_values(["seq", "pos"])
            kl = (final.exp() * (final - lp)).sum(-1).reshape(-1)
            assert torch.allclose(torch.tensor(rows.kl_to_final.tolist()), kl, atol=1e-4)
            assert torch.equal(torch.tensor(rows.top_ids.tolist()), lp.topk(3, -1).indices.reshape(-1, 3))
    last = df[df.layer == df.layer.max()]
    assert (last.kl_to_final == 0).all()
    cmp = interp.lens_comparison(tiny_model, ids, lens)
    top = cmp[(cmp.layer == cmp.layer.max()) & (cmp.lens != "unigram")]
    assert (top.kl_to_final == 0).all() and (top.top1_agreement == 1).all()
    ce = -final[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    assert top.cross_entropy.tolist() == pytest.approx([ce.item()] * 2, rel=1e-5)
    # the constant: add-1/2 unigram of the next tokens, the same at every layer
    V = tiny_model.cfg.d_vocab
    q = (torch.bincount(ids[:, 1:].reshape(-1), minlength=V).double() + 0.5) / (ids[:, 1:].numel() + 0.5 * V)
    uni = cmp[cmp.lens == "unigram"]
    assert len(uni) == len(lens.sites) and uni.kl_to_final.nunique() == 1
    assert uni.cross_entropy.iloc[0] == pytest.approx(float(-q.log()[ids[:, 1:]].mean()), rel=1e-6)
    hand_kl = (final.double().exp() * (final.double() - q.log())).sum(-1).mean()
    assert uni.kl_to_final.iloc[0] == pytest.approx(float(hand_kl), rel=1e-4)
    assert uni.top1_agreement.iloc[0] == pytest.approx(float((final.argmax(-1) == q.argmax()).double().mean()))
    assert uni.cross_entropy.iloc[0] < float(torch.log(torch.tensor(float(V))))  # beats the uniform guess in sample
    fitted_elsewhere = interp.lens_comparison(tiny_model, ids, lens, unigram_fit=ids_of(2, (2, 24)))
    assert fitted_elsewhere[fitted_elsewhere.lens == "unigram"].cross_entropy.iloc[0] > uni.cross_entropy.iloc[0]
    # every summary works on the tuned lens' frame
    assert len(interp.lens_summary(df)) == len(lens.sites)
    assert len(interp.first_top1_layer(df)) == 2 * 23


def test_training_leaves_the_model_untouched_and_records_held_out_kl(tiny_model):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    corpus = ids_of(2, (12, 64))
    lens = interp.train_tuned_lens(tiny_model, corpus[:8], steps=3, batch_size=4, progress=False, held_out=corpus[8:])
    assert all(torch.equal(before[k], v) for k, v in tiny_model.state_dict().items())
    assert all(p.requires_grad and p.grad is None for p in tiny_model.parameters())
    assert any(p.abs().sum() > 0 for p in lens.parameters())
    cmp = interp.lens_comparison(tiny_model, corpus[8:], lens)
    tuned = cmp[cmp.lens == "tuned"]
    assert lens.info["held_out_kl"] == {str(k): v for k, v in zip(tuned.layer, tuned.kl_to_final)}
    assert lens.step == 3 and lens.info["steps"] == 3


def test_a_lens_trained_on_half_a_corpus_lowers_held_out_kl_on_a_demo():
    model = load("gpt-1")
    corpus = model_text(40_000, seed=5)
    half = len(corpus) // 2
    lens = interp.train_tuned_lens(model, corpus[:half], steps=25, batch_size=4, progress=False)
    # 8,000 characters of the held-out half (~2,000 positions) settle it: the logit lens' KL is ~6x the tuned one's
    cmp = interp.lens_comparison(model, corpus[half:half + 8_000], lens)
    logit, tuned = (cmp[cmp.lens == n].set_index("layer").kl_to_final for n in ("logit", "tuned"))
    assert (tuned.iloc[:-1] < logit.iloc[:-1]).all(), cmp


def test_resuming_equals_one_uninterrupted_run(tiny_model):
    data = ids_of(3, (10, 64))
    whole = interp.train_tuned_lens(tiny_model, data, steps=6, batch_size=4, progress=False)
    part = interp.train_tuned_lens(tiny_model, data, steps=6, batch_size=4, progress=False, stop_at=3)
    assert part.step == 3
    part = interp.train_tuned_lens(tiny_model, data, steps=6, batch_size=4, progress=False, lens=part)
    for a, b in zip(whole.parameters(), part.parameters()):
        assert torch.equal(a, b)


def test_save_load_is_bit_exact_and_a_foreign_lens_is_refused(tiny_model, tmp_path):
    lens = random_lens(tiny_model, seed=4)
    lens.info = {"data": "random ids", "steps": 7, "held_out_kl": {"0": 1.5}}
    path = lens.save(tmp_path / "lens")
    again = interp.TunedLens.load(tiny_model, tmp_path / "lens")
    assert again.state_dict().keys() == lens.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(lens.state_dict().values(), again.state_dict().values()))
    assert again.info == lens.info and again.sites == lens.sites
    assert interp.load_tuned_lens(tiny_model, path).model_fingerprint == lens.model_fingerprint

    torch.manual_seed(1)
    other = randomize_gains(Sprout(TINY).eval(), seed=1)  # same config, other weights
    with pytest.raises(ValueError, match="fingerprint"):
        interp.TunedLens.load(other, tmp_path / "lens")
    with pytest.raises(ValueError, match="another model"):
        interp.tuned_lens(other, ids_of(0), lens)
    with pytest.raises(ValueError, match="another model"):
        interp.train_tuned_lens(other, ids_of(0), steps=1, lens=lens, progress=False)
    wider = Sprout(TINY.__class__(**{**TINY.to_dict(), "n_layer": 3})).eval()
    with pytest.raises(ValueError, match="n_layer: lens 2, model 3"):
        interp.TunedLens.load(wider, path)


def test_save_never_overwrites_a_file_that_is_not_a_lens(tiny_model, tmp_path):
    (tmp_path / "tuned_lens.json").write_text("my notes")
    with pytest.raises(FileExistsError, match="not a tuned lens"):
        interp.TunedLens(tiny_model).save(tmp_path)
    assert (tmp_path / "tuned_lens.json").read_text() == "my notes"


def test_bad_input_gets_a_clear_error(tiny_model):
    with pytest.raises(ValueError, match="steps must be a positive int"):
        interp.train_tuned_lens(tiny_model, ids_of(0), steps=0)
    with pytest.raises(ValueError, match="non-empty"):
        interp.train_tuned_lens(tiny_model, torch.zeros(0, dtype=torch.long), steps=1)
    with pytest.raises(ValueError, match="no texts"):
        interp.train_tuned_lens(tiny_model, [], steps=1)
    with pytest.raises(ValueError, match="fewer than one window"):
        interp.train_tuned_lens(tiny_model, ids_of(0, (1, 10)), steps=1, seq_len=32)
    with pytest.raises(TypeError, match="interp.TunedLens"):
        interp.tuned_lens(tiny_model, ids_of(0), lens="gpt-4")
    with pytest.raises(ValueError, match="not a hooked model"):
        interp.TunedLens(torch.nn.Linear(4, 4))
    with pytest.raises(FileNotFoundError, match="no tuned lens for this Sprout"):
        interp.load_tuned_lens(tiny_model)


def test_windows_cut_one_stream_without_padding(tiny_model):
    w = stream_windows(tiny_model, [torch.arange(50), torch.arange(50, 100)], seq_len=30)
    assert torch.equal(w, torch.arange(90).view(3, 30))


@pytest.mark.parametrize("name", ["gpt-1", "gpt-4", "sprout-mini", "walkthrough"])
def test_shipped_lens_beats_the_logit_lens_on_independent_held_out_text(name):
    model = load(name)
    lens = interp.load_tuned_lens(model)
    assert lens.info["steps"] >= 1 and lens.info["held_out_kl"]
    text = model_text(6_000, seed=987_654)  # other stories than the lens was trained or evaluated on
    cmp = interp.lens_comparison(model, text, lens)
    logit, tuned = (cmp[cmp.lens == n].set_index("layer").kl_to_final for n in ("logit", "tuned"))
    assert (tuned.iloc[:-1] < logit.iloc[:-1]).all(), cmp
    assert tuned.iloc[-1] == 0


def test_walkthrough_gpt_trains_and_a_model_without_the_hooks_is_named():
    from sprout.walkthrough import build_step

    torch.manual_seed(0)
    model = build_step("4.10").eval()
    ids = torch.randint(0, 65, (4, 16))
    lens = interp.train_tuned_lens(model, ids, steps=2, batch_size=2, progress=False)
    assert interp.tuned_lens(model, ids, lens).columns.tolist() == interp.logit_lens(model, ids).columns.tolist()
    with pytest.raises(ValueError, match=r"WalkthroughGPT has no hook point 'blocks.0.hook_resid_pre'"):
        interp.train_tuned_lens(build_step("4.2"), ids, steps=1)


def _reference_kls(model, lens, ids):
    """KL(output || lens) per translator, with autograd's own log_softmax, in float64."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
    log_p = F.log_softmax(logits.double().flatten(0, 1), -1)
    kls = []
    for i, name in enumerate(lens.sites[:-1]):
        log_q = F.log_softmax(unembed(model, lens(i, cache[name].flatten(0, 1))).double(), -1)
        kls.append((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    return kls


@pytest.mark.parametrize("name", ["tiny", "walkthrough"])  # a bias-free Linear head, and another output layer
def test_lens_step_equals_autograds_kl_and_its_gradient(tiny_model, name):
    model = tiny_model if name == "tiny" else load("walkthrough")
    torch.manual_seed(0)
    lens = interp.TunedLens(model)
    for t in lens.translators:
        torch.nn.init.normal_(t.weight, std=0.05)
        torch.nn.init.normal_(t.bias, std=0.05)
    ids = torch.randint(0, int(model.cfg.d_vocab), (2, 9), generator=torch.Generator().manual_seed(1))
    with _frozen(model):
        kls = lens_step(model, lens, ids)
        ours = [p.grad.clone() for p in lens.parameters()]
        lens.zero_grad()
        ref = _reference_kls(model, lens, ids)
        torch.stack(ref).sum().backward()
    assert kls == pytest.approx([float(k.detach()) for k in ref], abs=2e-5)
    for a, b in zip(ours, lens.parameters()):
        torch.testing.assert_close(a, b.grad.to(a.dtype), atol=1e-5, rtol=1e-4)


def test_the_fused_unembedding_loss_and_its_buffers():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(6, 11, generator=g, dtype=torch.float64), -1)
    scratch = Scratch()
    assert torch.autograd.gradcheck(lambda a, b: _UnembedCrossEntropy.apply(a, b, p, Scratch()), (x, w))
    loss = _UnembedCrossEntropy.apply(x, w, p, scratch)
    expected = -(p * torch.log_softmax(x @ w.T, -1)).sum(-1).mean()
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-12)
    first = torch.autograd.grad(loss, (x, w), retain_graph=True)
    again = torch.autograd.grad(loss, (x, w), retain_graph=True)  # a repeated backward reads the same buffers
    for a, b, c in zip(first, again, torch.autograd.grad(expected, (x, w))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c)
    _UnembedCrossEntropy.apply(x, w, p, scratch)  # a later forward overwrites the buffers the first one reads
    with pytest.raises(RuntimeError, match="overwritten by a later forward"):
        loss.backward()


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_training_works_inside_no_grad_and_inference_mode(tiny_model, context):
    ids = torch.randint(0, int(tiny_model.cfg.d_vocab), (12, 16), generator=torch.Generator().manual_seed(3))
    expected = interp.train_tuned_lens(tiny_model, ids, steps=3, batch_size=4, progress=False)
    with context():
        lens = interp.train_tuned_lens(tiny_model, ids, steps=3, batch_size=4, progress=False)
    for a, b in zip(lens.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with context():
        part = interp.train_tuned_lens(tiny_model, ids, steps=4, batch_size=4, progress=False, stop_at=3)
    interp.train_tuned_lens(tiny_model, ids, steps=4, batch_size=4, progress=False, lens=part)  # updatable after
    assert part.step == 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_training_a_model_of_another_dtype(tiny_model, dtype):
    model = copy.deepcopy(tiny_model).to(dtype)
    ids = torch.randint(0, int(model.cfg.d_vocab), (12, 16), generator=torch.Generator().manual_seed(3))
    lens = interp.train_tuned_lens(model, ids, steps=2, batch_size=4, progress=False)
    assert lens.step == 2 and all(torch.isfinite(p).all() for p in lens.parameters())


def test_steps_must_be_an_int_not_a_bool(tiny_model):
    with pytest.raises(ValueError, match="steps must be a positive int"):
        interp.train_tuned_lens(tiny_model, torch.zeros(64, dtype=torch.long), steps=True)
