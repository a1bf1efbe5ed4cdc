"""SAE files: SAELens' layout written, SAELens-saved folders (written here by hand from its format) read,
foreign and tampered folders refused naming the file and the field; shipped dictionaries found by
fingerprint."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
import sprout
from interp.saes.files import SAEFileError
from interp.saes.kinds import KIND_NAMES
from interp.saes.shipped import shipped_folder
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

HOOK = "blocks.0.hook_resid_post"


def _sae(kind, d_in=64, d_sae=96):
    sae = interp.SAE(d_in, d_sae, kind=kind, k=6 if kind in ("topk", "batchtopk", "matryoshka") else None,
                     hook_name=HOOK, seed=2)
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.3)
        sae.b_dec.normal_(0, 0.3)
        if sae.threshold is not None:
            sae.threshold.uniform_(0, 0.3)
    return sae


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_round_trip_and_saelens_layout(tmp_path, kind):
    sae = _sae(kind)
    sae.save(tmp_path / "sae")
    assert sorted(os.listdir(tmp_path / "sae")) == ["cfg.json", "sae_weights.safetensors"]
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    arch = {"relu": "standard", "topk": "topk"}.get(kind, "jumprelu")  # BatchTopK is saved as JumpReLU, as SAELens does
    assert cfg["architecture"] == arch and cfg["d_in"] == 64 and cfg["d_sae"] == 96
    assert cfg["metadata"]["hook_name"] == HOOK and cfg["hook_name"] == HOOK and cfg["dtype"] == "float32"
    assert cfg["apply_b_dec_to_input"] is True and cfg["normalize_activations"] == "none"
    assert (cfg.get("k") == 6) == (kind == "topk")
    tensors = load_file(str(tmp_path / "sae" / "sae_weights.safetensors"))
    assert tensors["W_enc"].shape == (64, 96) and tensors["W_dec"].shape == (96, 64)
    assert ("threshold" in tensors) == (arch == "jumprelu")
    back = interp.SAE.load(tmp_path / "sae")
    x = torch.randn(5, 64)
    assert back.kind == kind and back.k == sae.k and back.hook_name == HOOK
    assert torch.equal(back.encode(x), sae.encode(x)) and torch.equal(back(x), sae(x))


def test_transcoder_round_trip(tmp_path):
    tc = interp.Transcoder(64, 80, 64, kind="relu", skip=True, layer=1)
    with torch.no_grad():
        tc.W_skip.normal_()
    tc.save(tmp_path / "tc")
    cfg = json.loads((tmp_path / "tc" / "cfg.json").read_text())
    assert cfg["architecture"] == "skip_transcoder" and cfg["d_out"] == 64 and cfg["apply_b_dec_to_input"] is False
    assert cfg["metadata"]["hook_name"] == "blocks.1.ln2.hook_normalized"
    assert cfg["metadata"]["hook_name_out"] == "blocks.1.hook_mlp_out"
    back = interp.Transcoder.load(tmp_path / "tc")
    x = torch.randn(3, 64)
    assert isinstance(back, interp.Transcoder) and back.skip and torch.equal(back(x), tc(x))
    _sae("relu").save(tmp_path / "plain")
    with pytest.raises(SAEFileError, match="not a transcoder"):
        interp.Transcoder.load(tmp_path / "plain")


def _saelens_folder(path, cfg, tensors):
    path.mkdir()
    (path / "cfg.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "sae_weights.safetensors"))
    return path


def _weights(d_in=8, d_sae=20, d_out=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_out = d_out or d_in
    return {"W_enc": torch.randn(d_in, d_sae, generator=g), "b_enc": torch.randn(d_sae, generator=g) * 0.1,
            "W_dec": torch.randn(d_sae, d_out, generator=g), "b_dec": torch.randn(d_out, generator=g) * 0.1}


def _v6(arch, **extra):
    meta = {"model_name": "gpt2", "hook_name": HOOK, "hook_head_index": None, "sae_lens_version": "6.5.0"}
    return {"architecture": arch, "d_in": 8, "d_sae": 20, "dtype": "float32", "device": "cpu",
            "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
            "metadata": meta, **extra}


def test_reads_saelens_standard_topk_jumprelu(tmp_path):
    x = torch.randn(6, 8)
    w = _weights()
    sae = interp.SAE.load(_saelens_folder(tmp_path / "standard", _v6("standard"), w))
    acts = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    assert sae.kind == "relu" and sae.hook_name == HOOK
    assert torch.allclose(sae(x), acts @ w["W_dec"] + w["b_dec"], atol=1e-5)

    # SAELens' TopK with rescale_acts_by_decoder_norm: pre-activations times the decoder norms, TopK,
    # then latents divided by them again before the decoder
    norms = w["W_dec"].norm(dim=-1)
    pre = ((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]) * norms
    top = pre.topk(3, dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    want = (acts / norms) @ w["W_dec"] + w["b_dec"]
    sae = interp.SAE.load(_saelens_folder(tmp_path / "topk", _v6("topk", k=3, rescale_acts_by_decoder_norm=True), w))
    assert sae.kind == "topk" and sae.k == 3 and torch.allclose(sae(x), want, atol=1e-4)

    thr = torch.rand(20) * 0.5
    sae = interp.SAE.load(_saelens_folder(tmp_path / "jr", _v6("jumprelu"), {**w, "threshold": thr}))
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(pre) * (pre > thr)
    assert sae.kind == "jumprelu" and torch.allclose(sae(x), acts @ w["W_dec"] + w["b_dec"], atol=1e-5)


def test_reads_pre_6_flat_configs_and_saelens_transcoders(tmp_path):
    w = _weights()
    flat = {"d_in": 8, "d_sae": 20, "dtype": "float32", "device": "cpu", "model_name": "gpt2", "hook_point": HOOK,
            "hook_point_layer": 0, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 4},
            "apply_b_dec_to_input": False, "normalize_activations": False}
    sae = interp.SAE.load(_saelens_folder(tmp_path / "old", flat, w))
    x = torch.randn(3, 8)
    pre = x @ w["W_enc"] + w["b_enc"]  # apply_b_dec_to_input false
    top = pre.topk(4, dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    assert sae.hook_name == HOOK and sae.k == 4 and torch.allclose(sae(x), acts @ w["W_dec"] + w["b_dec"], atol=1e-5)

    wt = {**_weights(d_out=5), "W_skip": torch.randn(5, 8)}
    cfg = {**_v6("skip_transcoder", d_out=5), "apply_b_dec_to_input": False}
    cfg["metadata"]["hook_name_out"] = "blocks.0.hook_mlp_out"
    tc = interp.Transcoder.load(_saelens_folder(tmp_path / "tc", cfg, wt))
    acts = torch.relu(x @ wt["W_enc"] + wt["b_enc"])
    assert tc.hook_name_out == "blocks.0.hook_mlp_out"
    assert torch.allclose(tc(x), acts @ wt["W_dec"] + wt["b_dec"] + x @ wt["W_skip"].T, atol=1e-5)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.update(d_in="8"), "d_in"), (lambda c: c.update(d_sae=True), "d_sae"),
    (lambda c: c.update(d_in=-1), "d_in"), (lambda c: c.update(architecture="gated"), "architecture"),
    (lambda c: c.update(dtype="int8"), "dtype"), (lambda c: c.update(metadata=[1]), "metadata"),
    (lambda c: c.update(k=3.5, architecture="topk"), "k"), (lambda c: c.pop("d_sae"), "d_sae"),
    (lambda c: c.update(normalize_activations="layer_norm"), "normalize_activations"),
    (lambda c: c["metadata"].update(hook_name=7), "hook_name"),
])
def test_tampered_cfg_refused_naming_file_and_field(tmp_path, edit, field):
    cfg = _v6("standard")
    edit(cfg)
    folder = _saelens_folder(tmp_path / "bad", cfg, _weights())
    with pytest.raises(SAEFileError, match=f"cfg.json.*{field}"):
        interp.SAE.load(folder)


def test_deep_nesting_nan_and_non_json_refused(tmp_path):
    folder = _saelens_folder(tmp_path / "deep", _v6("standard"), _weights())
    cfg = _v6("standard")
    cfg["metadata"]["x"] = json.loads("[" * 50 + "]" * 50)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFileError, match="cfg.json.*nested"):
        interp.SAE.load(folder)
    (folder / "cfg.json").write_text(json.dumps(_v6("standard")).replace('"d_in": 8', '"d_in": NaN'))
    with pytest.raises(SAEFileError, match="cfg.json"):
        interp.SAE.load(folder)
    (folder / "cfg.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(SAEFileError, match="cfg.json"):
        interp.SAE.load(folder)


@pytest.mark.parametrize("tensors, what", [
    ({**_weights(), "W_enc": torch.ones(8, 20, dtype=torch.int32)}, "W_enc.*dtype"),
    ({**_weights(), "b_dec": torch.full((8,), float("nan"))}, "b_dec.*NaN"),
    ({**_weights(), "W_dec": torch.randn(20, 9)}, "W_dec.*shape"),
    ({k: v for k, v in _weights().items() if k != "b_enc"}, "b_enc.*missing"),
    ({**_weights(), "extra": torch.zeros(2)}, "unexpected"),
])
def test_bad_tensors_refused(tmp_path, tensors, what):
    folder = _saelens_folder(tmp_path / "bad", _v6("standard"), tensors)
    with pytest.raises(SAEFileError, match=f"sae_weights.safetensors.*{what}"):
        interp.SAE.load(folder)


def test_fifo_and_truncated_weights_refused(tmp_path):
    folder = _saelens_folder(tmp_path / "f", _v6("standard"), _weights())
    (folder / "sae_weights.safetensors").write_bytes((folder / "sae_weights.safetensors").read_bytes()[:100])
    with pytest.raises(SAEFileError, match="sae_weights.safetensors"):
        interp.SAE.load(folder)
    (folder / "sae_weights.safetensors").unlink()
    os.mkfifo(folder / "sae_weights.safetensors")
    with pytest.raises(SAEFileError, match="sae_weights.safetensors.*not a regular file"):
        interp.SAE.load(folder)  # refused before opening: a FIFO would block the read forever
    with pytest.raises(FileNotFoundError):
        interp.SAE.load(tmp_path / "nothing")


def test_never_overwrites_a_folder_that_is_not_ours(tmp_path):
    theirs = _saelens_folder(tmp_path / "theirs", _v6("standard"), _weights())
    before = (theirs / "cfg.json").read_bytes()
    with pytest.raises(FileExistsError, match="refusing"):
        _sae("relu").save(theirs)
    assert (theirs / "cfg.json").read_bytes() == before
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        _sae("relu").save(tmp_path / "notes")
    ours = tmp_path / "ours"
    _sae("relu").save(ours)
    _sae("topk").save(ours)  # ours: replaced whole
    assert interp.SAE.load(ours).kind == "topk"


@pytest.fixture
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def test_model_checks_on_load(tmp_path, model):
    sae = interp.train_sae(model, HOOK, data=torch.randint(0, 256, (4, 64)), kind="topk", d_sae=32, k=4, steps=2,
                           batch_size=64, progress=False)
    sae.save(tmp_path / "s")
    assert interp.SAE.load(tmp_path / "s", model=model).model_fingerprint == sae.model_fingerprint
    other = randomize_gains(Sprout(TINY).eval(), seed=5)
    with pytest.raises(ValueError, match="another model.*fingerprint"):
        interp.SAE.load(tmp_path / "s", model=other)
    bigger = Sprout(TINY.__class__(**{**TINY.__dict__, "d_model": 32, "n_head": 2})).eval()
    with pytest.raises(ValueError, match="another model.*config"):
        interp.SAE.load(tmp_path / "s", model=bigger)
    foreign = _saelens_folder(tmp_path / "foreign", {**_v6("standard"), "d_in": 8}, _weights())
    with pytest.raises(ValueError, match="8-wide.*blocks.0.hook_resid_post.*64"):
        interp.SAE.load(foreign, model=model)  # no fingerprint: the hook's width decides
    cfg = _v6("standard")
    cfg["metadata"]["hook_name"] = "blocks.7.hook_resid_post"
    with pytest.raises(ValueError, match="no hook point 'blocks.7.hook_resid_post'"):
        interp.SAE.load(_saelens_folder(tmp_path / "nohook", cfg, _weights()), model=model)


def test_load_sae_and_load_transcoder_find_shipped_by_fingerprint(tmp_path, model):
    data = torch.randint(0, 256, (4, 64))
    sae = interp.train_sae(model, HOOK, data=data, kind="topk", d_sae=32, k=4, steps=2, batch_size=64, progress=False)
    tc = interp.train_transcoder(model, data, 1, kind="relu", d_sae=32, steps=2, batch_size=64, progress=False)
    root = tmp_path / "demo"
    sae.save(shipped_folder(root, hook=HOOK))
    tc.save(shipped_folder(root, layer=1))
    assert torch.equal(interp.load_sae(model, HOOK, root=root).W_enc, sae.W_enc)
    assert interp.load_transcoder(model, 1, root=root).hook_name_out == "blocks.1.hook_mlp_out"
    with pytest.raises(FileNotFoundError, match="no shipped SAE"):
        interp.load_sae(model, "blocks.1.hook_resid_post", root=root)
    with pytest.raises(FileNotFoundError, match="no shipped"):
        interp.load_sae(randomize_gains(Sprout(TINY).eval(), seed=9), HOOK, root=root)
    with pytest.raises(FileNotFoundError, match="no shipped transcoder"):
        interp.load_transcoder(model, 0)  # nothing shipped for a random model in the demos
    with pytest.raises(ValueError, match="no hook point"):
        interp.load_sae(model, "blocks.9.hook_resid_post")


def test_load_sae_and_load_transcoder_look_inside_a_run_folder(tmp_path, model):
    """A `sprout train` run folder: an SAE saved in RUN/saes/<hook>/ and a transcoder beside the latest
    checkpoint are both found from the run folder and from the checkpoint."""
    run = tmp_path / "myrun"
    for step in (20, 40):
        sprout.save(model, run / "checkpoints" / f"step_{step:08d}")
    data = torch.randint(0, 256, (4, 64))
    sae = interp.train_sae(model, HOOK, data=data, kind="topk", d_sae=32, k=4, steps=2, batch_size=64, progress=False)
    tc = interp.train_transcoder(model, data, 1, kind="relu", d_sae=32, steps=2, batch_size=64, progress=False)
    sae.save(shipped_folder(run, hook=HOOK))
    tc.save(shipped_folder(run / "checkpoints" / "step_00000040", layer=1))
    for root in (run, run / "checkpoints" / "step_00000040"):
        assert torch.equal(interp.load_sae(model, HOOK, root=root).W_enc, sae.W_enc)
        assert torch.equal(interp.load_transcoder(model, 1, root=root).W_enc, tc.W_enc)
    with pytest.raises(FileNotFoundError, match="no shipped transcoder"):  # from an older checkpoint: it and the run only
        interp.load_transcoder(model, 1, root=run / "checkpoints" / "step_00000020")
