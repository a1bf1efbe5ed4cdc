"""train_clt: a resumed run equals an uninterrupted one bit for bit, two torchrun processes equal one, the
harvest pairs every layer's MLP input with its output at the same tokens, and bad settings are refused."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import interp
from interp.saes.settings import SettingsError
from interp.saes.training.clt import _rows
from interp.saes.training.harvest import ModelSource
from sprout import Sprout, SproutConfig
from tests.conftest import randomize_gains

ROOT = Path(__file__).resolve().parents[4]
THREE = SproutConfig(vocab_size=256, context=64, n_layer=3, n_head=4, d_model=64, d_ff=128)
QUICK = dict(d_sae=32, k=8, steps=8, batch_size=128, progress=False, buffer_tokens=512, lr=3e-3, dead_tokens=256)


def three_layers():
    torch.manual_seed(0)
    return randomize_gains(Sprout(THREE).eval())


def ids():
    return torch.randint(0, 256, (12, 64), generator=torch.Generator().manual_seed(3))


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    model, data = three_layers(), ids()
    run = {**QUICK, "d_sae": 64, "k": 2, "dead_tokens": 128}  # latents die within the run: AuxK engages
    whole = interp.train_clt(model, data, skip=True, **run)
    interp.train_clt(model, data, skip=True, checkpoint=tmp_path / "ck", stop_at=5, **run)
    resumed = interp.train_clt(model, data, skip=True, checkpoint=tmp_path / "ck", resume=True, **run)
    assert resumed.info["steps"] == 8 and whole.info["dead_fraction"] > 0  # AuxK engaged within the run
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert whole.W_skip.abs().sum() > 0 and whole.threshold.abs().sum() > 0
    with pytest.raises(ValueError, match="resume.*lr"):
        interp.train_clt(model, data, skip=True, checkpoint=tmp_path / "ck", resume=True, **{**run, "lr": 1e-3})
    with pytest.raises(FileExistsError, match="resume=True"):
        interp.train_clt(model, data, skip=True, checkpoint=tmp_path / "ck", **run)


def test_each_steps_rows_are_the_models_inputs_and_outputs_at_the_same_tokens():
    model, data = three_layers(), ids()
    hooks = [h for l in range(3) for h in (f"blocks.{l}.ln2.hook_normalized", f"blocks.{l}.hook_mlp_out")]
    src = ModelSource(model, data, hooks, 128, 0, None, 16, 512)
    x, y = _rows(src, 2, 3)
    assert x.shape == y.shape == (3, 128, 64)
    # the MLP of each block applied to the harvested input (with ln2's gain) gives the harvested output, row by row
    for l in range(3):
        block = model.blocks[l]
        norm = getattr(block, "norm2", None) or getattr(block, "ln2")
        with torch.no_grad():
            out = block.mlp(x[l] * norm.weight)
        torch.testing.assert_close(out, y[l], atol=1e-5, rtol=1e-4)


def test_the_trained_clt_runs_in_a_replacement_model_and_keeps_k_per_token():
    model, data = three_layers(), ids()
    clt = interp.train_clt(model, data, **{**QUICK, "steps": 40, "dead_tokens": None})
    assert clt.kind == "batchtopk" and clt.info["train_l0"] == 8.0  # BatchTopK: k per token over all layers, exactly
    assert clt.info["train_fvu"] < 0.9
    rm = interp.ReplacementModel(model, clt.to_jumprelu())  # checked against the model it was trained on
    with torch.no_grad():
        torch.testing.assert_close(rm.forward(data[0, :16]), model(data[:1, :16])[0], atol=1e-5, rtol=0)


def test_bad_settings_are_refused():
    model, data = three_layers(), ids()
    with pytest.raises(SettingsError, match="batchtopk"):
        interp.train_clt(model, data, kind="topk", **QUICK)
    with pytest.raises(SettingsError, match="unknown training settings"):
        interp.train_clt(model, data, widths_typo=3, **QUICK)
    with pytest.raises(SettingsError, match="stop_at"):
        interp.train_clt(model, data, stop_at=0, **QUICK)
    # k counts latents over all 3 layers: more than one layer's d_sae is fine, more than all of them is not
    with pytest.raises(SettingsError, match="n_layers \\* d_sae = 12"):
        interp.train_clt(model, data, **{**QUICK, "d_sae": 4, "k": 13})
    assert interp.train_clt(model, data, **{**QUICK, "d_sae": 4, "k": 6, "steps": 1}).k == 6


SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from safetensors.torch import save_file
    from tests.interp.saes.training.test_clt import train_small
    torch.set_num_threads(1)
    save_file(train_small(), f"{sys.argv[1]}/clt-{os.environ['RANK']}.safetensors")
""")


def train_small() -> dict:
    clt = interp.train_clt(three_layers(), ids(), skip=True, **QUICK)
    return {k: v.detach().contiguous() for k, v in clt.state_dict().items()}


def test_two_processes_equal_one_process(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = train_small()
    r0, r1 = (load_file(str(tmp_path / f"clt-{r}.safetensors")) for r in ("0", "1"))
    assert set(r0) == set(one) and all(torch.equal(r0[k], r1[k]) for k in one)
    for k in one:
        assert torch.allclose(r0[k], one[k], atol=1e-5, rtol=1e-4), k
