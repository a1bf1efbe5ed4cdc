"""Dictionaries and their trainers through one settings contract (issue 36, item 1): every constructor and
trainer argument type- and range-checked before any work, naming it; resume files checked field by field,
naming the file; a run that diverges stops and says so."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import interp
from interp.saes.files import SAEFileError
from interp.saes.settings import TrainingDiverged

D = 8
ACTS = torch.randn(512, D, generator=torch.Generator().manual_seed(0))
QUICK = dict(kind="topk", d_sae=16, k=2, steps=4, batch_size=64, progress=False)


@pytest.mark.parametrize("kw, words", [
    (dict(kind="jumprelu", bandwidth=0), "bandwidth must be > 0, got 0"),
    (dict(kind="jumprelu", bandwidth=math.nan), "bandwidth must be a finite number, got nan"),
    (dict(kind="jumprelu", bandwidth=-0.1), "bandwidth must be > 0"),
    (dict(seed=1.7), "seed must be an integer, got 1.7"), (dict(seed=-1), "seed must be in"),
    (dict(seed=True), "seed must be an integer, got True"), (dict(d_out=2.0), "d_out must be an integer or None"),
    (dict(hook_name=""), "hook_name must be a hook name"), (dict(hook_name=3), "hook_name must be a string"),
    (dict(dtype=torch.int64), "dtype must be a floating torch dtype"), (dict(dtype="float32"), "dtype"),
])
def test_sae_arguments_are_checked_naming_them(kw, words):
    with pytest.raises(ValueError, match=words):
        interp.SAE(D, 16, **kw)


@pytest.mark.parametrize("kw, words", [(dict(skip="no"), "skip must be true or false, got 'no'"),
                                       (dict(layer=-1), "layer must be >= 0"), (dict(layer=1.0), "layer must be an integer")])
def test_transcoder_arguments_are_checked_naming_them(kw, words):
    with pytest.raises(ValueError, match=words):
        interp.Transcoder(D, 16, D, **kw)


@pytest.mark.parametrize("kw, words", [(dict(stop_at=0), r"stop_at must be in \[1, 4\]"),
                                       (dict(stop_at=-5), "stop_at must be in"), (dict(stop_at=2.0), "stop_at must be an integer"),
                                       (dict(resume="no"), "resume must be true or false"),
                                       (dict(checkpoint_every=0), "checkpoint_every must be >= 1")])
def test_run_arguments_are_checked_before_any_work(kw, words):
    with pytest.raises(ValueError, match=words):
        interp.train_sae(ACTS, **{**QUICK, **kw})


def test_duplicate_transcoder_layers_are_refused():
    from sprout import Sprout
    from tests.conftest import TINY
    with pytest.raises(ValueError, match="distinct blocks"):
        interp.train_transcoder(Sprout(TINY), torch.zeros(2, 8, dtype=torch.long), [0, 0], **QUICK)


def test_a_run_that_diverges_stops_and_says_so(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+ of 4.*lower lr"):
        interp.train_sae(ACTS * 1e20, **{**QUICK, "lr": 1e30, "grad_clip": 0.0, "normalize": False},
                         checkpoint=tmp_path / "ck")
    assert not (tmp_path / "ck" / "trainer.json").exists()


@pytest.fixture
def stopped(tmp_path):
    interp.train_sae(ACTS, **QUICK, checkpoint=tmp_path / "ck", stop_at=2)
    return tmp_path / "ck"


def _edit(folder, **changes):
    record = json.loads((folder / "trainer.json").read_text())
    for key, value in changes.items():
        if key.startswith("unit_"):
            record["units"][0][key[5:]] = value
        else:
            record[key] = value
    (folder / "trainer.json").write_text(json.dumps(record))


@pytest.mark.parametrize("changes, words", [
    (dict(step="2"), "field 'step' must be an integer"), (dict(step=-1), "field 'step' must be in"),
    (dict(step=99), "field 'step' must be in"), (dict(units=[]), "field 'units' must be a list of 1"),
    (dict(unit_scale_in="1.0"), r"field 'units\[0\].scale_in' must be a finite number"),
    (dict(unit_scale_out=0), r"field 'units\[0\].scale_out' must be > 0"),
    (dict(unit_adam_t=-3), r"field 'units\[0\].adam_t' must be >= 0"),
    (dict(unit_coef=None), r"field 'units\[0\].coef' must be a finite number, got None"),
])
def test_resume_files_are_checked_field_by_field(stopped, changes, words):
    _edit(stopped, **changes)
    with pytest.raises(SAEFileError, match="trainer.json: " + words):
        interp.train_sae(ACTS, **QUICK, checkpoint=stopped, resume=True)


@pytest.mark.parametrize("how, words", [("drop", "tensor '0.sae.W_enc' is missing"),
                                        ("nan", "tensor '0.sae.W_enc' holds NaN"),
                                        ("shape", "tensor '0.sae.W_enc' has shape")])
def test_resume_tensors_are_checked_naming_the_file(stopped, how, words):
    path = stopped / "trainer.safetensors"
    tensors = load_file(str(path))
    w = tensors.pop("0.sae.W_enc")
    if how == "nan":
        tensors["0.sae.W_enc"] = w * math.nan
    elif how == "shape":
        tensors["0.sae.W_enc"] = w[:, :3].contiguous()
    save_file(tensors, str(path))
    with pytest.raises(SAEFileError, match="trainer.safetensors: " + words):
        interp.train_sae(ACTS, **QUICK, checkpoint=stopped, resume=True)


def test_a_checkpoint_file_linked_from_outside_the_folder_is_refused(stopped, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (stopped / "trainer.safetensors").rename(outside)
    (stopped / "trainer.safetensors").symlink_to(outside)
    with pytest.raises(SAEFileError, match="trainer.safetensors.*outside"):
        interp.train_sae(ACTS, **QUICK, checkpoint=stopped, resume=True)
