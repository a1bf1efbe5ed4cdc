"""circuit-tracer's transcoder folders: written and read back to our reconstructions; TopK refused with the reason."""
import pytest
import torch
import yaml

import interp
from interp.saes import load_circuit_tracer, save_circuit_tracer
from tests.conftest import TINY


def _set(kinds, widths, skip=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    tcs = []
    for layer, (kind, width) in enumerate(zip(kinds, widths)):
        k = 4 if kind in ("topk", "batchtopk") else None
        tc = interp.Transcoder(TINY.d_model, width, kind=kind, k=k, skip=skip and layer == 0, layer=layer, seed=layer)
        with torch.no_grad():
            for p in tc.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            if tc.threshold is not None:
                tc.threshold.copy_(torch.rand(width, generator=g) * 0.4 - 0.1)  # some below 0: clamped, same latents
        tcs.append(tc.eval())
    return tcs


def _inputs(model, layer):
    tokens = torch.randint(0, TINY.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5))
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.ln2.hook_normalized")
    return cache[f"blocks.{layer}.ln2.hook_normalized"]


def test_a_set_written_for_circuit_tracer_reads_back_to_our_reconstructions(tiny_model, tmp_path):
    tcs = _set(["jumprelu", "batchtopk"], [96, 128])
    folder = save_circuit_tracer(tcs, tmp_path / "ct", tiny_model)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["model_kind"] == "transcoder_set" and config["feature_input_hook"] == "mlp.hook_in"
    back = load_circuit_tracer(folder, tiny_model)
    for ours, theirs in zip(tcs, back):
        x = _inputs(tiny_model, ours.layer)
        assert (theirs.kind, theirs.d_sae, theirs.skip) == (ours.kind, ours.d_sae, ours.skip)
        assert torch.equal(theirs.encode(x) != 0, ours.encode(x) != 0)
        assert torch.allclose(theirs(x), ours(x), atol=1e-5, rtol=1e-5)


def test_the_files_carry_circuit_tracers_orientation_fold_and_width(tiny_model, tmp_path):
    from safetensors.torch import load_file

    tcs = _set(["jumprelu", "relu"], [96, 64])
    folder = save_circuit_tracer(tcs, tmp_path / "ct", tiny_model)
    gain = tiny_model.blocks[1].norm2.weight.detach()
    f0, f1 = (load_file(str(folder / f"layer_{i}.safetensors")) for i in range(2))
    assert f1["W_enc"].shape == (96, TINY.d_model) and "activation_function.threshold" not in f1  # padded, ReLU
    assert torch.allclose(f1["W_enc"][:64] * gain, tcs[1].W_enc.detach().T, atol=1e-6)
    assert not f1["W_enc"][64:].any() and not f1["W_dec"][64:].any()  # the padding never writes
    assert f0["activation_function.threshold"].min() >= 0 and "W_skip" in f1  # one skip flag for the set
    x_mlp_in = _inputs(tiny_model, 1) * gain  # what circuit-tracer's mlp.hook_in holds
    pre = x_mlp_in @ f1["W_enc"].T + f1["b_enc"]
    assert torch.allclose(pre[..., :64], tcs[1].pre_acts(_inputs(tiny_model, 1)), atol=1e-5)


def test_a_topk_transcoder_is_refused_with_the_reason(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="block 1 is TopK: circuit-tracer's loader knows ReLU and JumpReLU only"):
        save_circuit_tracer(_set(["batchtopk", "topk"], [64, 64]), tmp_path / "ct", tiny_model)
    with pytest.raises(ValueError, match=r"one transcoder for each block 0..1 .* got transcoders for blocks \[0\]"):
        save_circuit_tracer(_set(["relu"], [64]), tmp_path / "ct", tiny_model)
    with pytest.raises(FileNotFoundError, match="config.yaml is missing"):
        load_circuit_tracer(tmp_path / "nothing", tiny_model)
