"""The cross-layer transcoder's arithmetic against a loop written out here, its files and its refusals."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
from interp.saes.files import SAEFileError


def filled(n_layers=3, d=8, d_sae=6, skip=True, kind="jumprelu", seed=0):
    k = 4 if kind == "batchtopk" else None
    clt = interp.CrossLayerTranscoder(n_layers, d, d_sae, kind=kind, k=k, skip=skip, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in clt.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        clt.threshold.copy_(torch.rand(clt.threshold.shape, generator=g, dtype=torch.float64))
    return clt


def test_forward_is_every_earlier_layers_write_plus_bias_and_skip():
    clt = filled()
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = clt(x)
    for out in range(3):
        want = clt.b_dec[out] + x[out] @ clt.W_skip[out].T
        for src in range(out + 1):
            pre = x[src] @ clt.W_enc[src] + clt.b_enc[src]
            act = torch.where((pre > clt.threshold[src]) & (pre > 0), pre, torch.zeros_like(pre))
            want = want + act @ clt.W_dec[src][:, out - src]  # W_dec_src [d_sae, n_layers - src, d_out]
        torch.testing.assert_close(got[out], want, atol=1e-12, rtol=0)
    assert clt.decoder(1, 2).shape == (6, 8) and list(clt.writes(0)) == [0, 1, 2]


def test_batchtopk_as_jumprelu_gives_the_same_outputs_and_folding_scales_keeps_them():
    clt = filled(kind="batchtopk")
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    jr = clt.to_jumprelu()
    assert jr.kind == "jumprelu" and torch.equal(jr(x), clt(x))
    s_in, s_out = [1.5, 0.5, 2.0], [3.0, 0.25, 1.0]
    scaled = x * torch.tensor(s_in, dtype=torch.float64)[:, None, None]
    before = clt(scaled) / torch.tensor(s_out, dtype=torch.float64)[:, None, None]
    clt.fold_scales_(s_in, s_out)
    torch.testing.assert_close(clt(x), before, atol=1e-12, rtol=0)


def test_save_load_round_trip(tmp_path):
    clt = filled()
    clt.info = {"steps": 3}
    clt.save(tmp_path / "clt")
    back = interp.CrossLayerTranscoder.load(tmp_path / "clt")
    assert back.kind == "jumprelu" and back.skip and back.info == {"steps": 3}
    for (n, a), (_, b) in zip(clt.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    cfg = json.loads((tmp_path / "clt" / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu_clt" and cfg["n_layers"] == 3 and cfg["feature_input_hook"] == "ln2.hook_normalized"
    assert load_file(str(tmp_path / "clt" / "sae_weights.safetensors"))["W_dec_1"].shape == (6, 2, 8)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("W_dec_2"), "'W_dec_2' is missing"),
    (lambda t: t.update(W_enc=t["W_enc"][:, :, :3].contiguous()), "'W_enc' has shape"),
    (lambda t: t.update(b_dec=t["b_dec"] * float("nan")), "'b_dec' holds NaN"),
    (lambda t: t.update(extra=torch.zeros(1)), "unexpected tensor"),
])
def test_bad_weights_are_refused_by_name(tmp_path, edit, match):
    folder = filled().save(tmp_path / "clt")
    tensors = load_file(str(folder / "sae_weights.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    with pytest.raises(SAEFileError, match=match):
        interp.CrossLayerTranscoder.load(folder)


@pytest.mark.parametrize("field,value,match", [("n_layers", 0, "'n_layers' must be an int"),
                                               ("architecture", "jumprelu_transcoder", "'architecture'"),
                                               ("feature_input_hook", "hook_resid_mid", "'feature_input_hook'")])
def test_bad_cfg_is_refused_by_name(tmp_path, field, value, match):
    folder = filled().save(tmp_path / "clt")
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg[field] = value
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFileError, match=match):
        interp.CrossLayerTranscoder.load(folder)


def test_bad_arguments_and_inputs_are_refused():
    with pytest.raises(ValueError, match="kind"):
        interp.CrossLayerTranscoder(2, 8, 4, kind="topk")
    with pytest.raises(ValueError, match="n_layers"):
        interp.CrossLayerTranscoder(0, 8, 4)
    clt = filled()
    with pytest.raises(ValueError, match="8-wide"):
        clt.encode(0, torch.zeros(2, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="one tensor per layer"):
        clt(torch.zeros(2, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="write to layers 2..2, not to 1"):
        clt.decoder(2, 1)
    with pytest.raises(ValueError, match="block 0..2"):
        clt.pre_acts(3, torch.zeros(8, dtype=torch.float64))


def test_circuit_tracer_clt_form_reads_mlp_hook_in_with_the_same_pre_activations(tmp_path):
    import yaml

    from tests.interp.graphs.tiny import tiny_sprout
    model = tiny_sprout(torch.float32)
    clt = filled(n_layers=2, d=64, d_sae=6, skip=False)
    clt = clt.float()
    interp.saes.save_circuit_tracer(clt, tmp_path / "ct", model)
    assert yaml.safe_load((tmp_path / "ct" / "config.yaml").read_text())["model_kind"] == "cross_layer_transcoder"
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(ids)
    for i in range(2):
        enc = load_file(str(tmp_path / "ct" / f"W_enc_{i}.safetensors"))
        dec = load_file(str(tmp_path / "ct" / f"W_dec_{i}.safetensors"))[f"W_dec_{i}"]
        assert enc[f"W_enc_{i}"].shape == (6, 64) and dec.shape == (6, 2 - i, 64)
        norm = cache[f"blocks.{i}.ln2.hook_normalized"][0]
        hook_in = norm * model.blocks[i].norm2.weight  # circuit-tracer's mlp.hook_in: ln2's output, gain applied
        theirs = hook_in @ enc[f"W_enc_{i}"].T + enc[f"b_enc_{i}"]
        torch.testing.assert_close(theirs, clt.pre_acts(i, norm), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(dec, clt.W_dec[i].detach())
    with pytest.raises(ValueError, match="skip"):
        interp.saes.save_circuit_tracer(filled(n_layers=2, d=64).float(), tmp_path / "ct2", model)


def test_a_cfg_asking_for_terabytes_is_refused_by_its_weights_before_anything_is_allocated(tmp_path):
    folder = filled().save(tmp_path / "clt")
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg.update(d_sae=10**9, n_layers=1000)  # about 64 TB of float64 if built before the weights are checked
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFileError, match="unexpected tensor|has shape"):
        interp.CrossLayerTranscoder.load(folder)
