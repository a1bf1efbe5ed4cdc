"""SAE folders checked at the door (issue 36): cfg.json's sizes against the weights' header before a
dictionary is allocated (bad case 4), files that leave the folder through a symlink refused, and the
record of a dictionary without a fingerprint compared with the model's config."""
import json
import resource
import time

import pytest

import interp
from interp.saes.files import SAEFileError

HOOK = "blocks.0.hook_resid_post"


def _saved(tmp_path, **kw):
    sae = interp.SAE(16, 32, kind="relu", hook_name=HOOK, seed=1, **kw)
    return sae, sae.save(tmp_path / "sae")


def _edit_cfg(folder, **changes):
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg.update(changes)
    (folder / "cfg.json").write_text(json.dumps(cfg))


def test_a_huge_d_sae_in_cfg_json_is_named_before_anything_is_allocated(tmp_path):
    _, folder = _saved(tmp_path)
    _edit_cfg(folder, d_sae=10 ** 9)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(SAEFileError, match=r"fields d_in, d_sae are \[16, 1000000000\].*W_enc of shape \[16, 32\]"):
        interp.SAE.load(folder)
    assert time.perf_counter() - t0 < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing of 64 GB built


def test_a_weights_file_that_is_not_safetensors_is_named(tmp_path):
    _, folder = _saved(tmp_path)
    (folder / "sae_weights.safetensors").write_bytes(b"\xff" * 8 + b"junk")
    with pytest.raises(SAEFileError, match="sae_weights.safetensors.*not a safetensors file"):
        interp.SAE.load(folder)


def test_a_file_read_through_a_symlink_out_of_the_folder_is_refused(tmp_path):
    _, folder = _saved(tmp_path)
    outside = tmp_path / "elsewhere.json"
    (folder / "cfg.json").rename(outside)
    (folder / "cfg.json").symlink_to(outside)
    with pytest.raises(SAEFileError, match="cfg.json: the SAE config is a link to .*outside"):
        interp.SAE.load(folder)


def _topk_folder(tmp_path):
    sae = interp.SAE(16, 32, kind="topk", k=4, hook_name=HOOK, seed=1)
    return sae.save(tmp_path / "topk")


@pytest.mark.parametrize("changes, words", [(dict(k=0), "k must be in 1..d_sae"),
                                            (dict(rescale_acts_by_decoder_norm="no"), "rescale_acts_by_decoder_norm")])
def test_falsy_and_truthy_fields_are_read_as_they_are(tmp_path, changes, words):
    folder = _topk_folder(tmp_path)
    _edit_cfg(folder, **changes)
    with pytest.raises(SAEFileError, match=words):
        interp.SAE.load(folder)


def test_a_zero_bandwidth_in_our_record_is_refused_not_replaced(tmp_path):
    folder = interp.SAE(16, 32, kind="jumprelu", hook_name=HOOK).save(tmp_path / "jr")
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["metadata"]["sprout"]["bandwidth"] = 0
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEFileError, match="bandwidth must be > 0, got 0"):
        interp.SAE.load(folder)


def test_a_dictionary_without_a_fingerprint_still_has_its_model_config_compared():
    from interp._core.identity import model_config

    from sprout import Sprout
    from tests.conftest import TINY
    model = Sprout(TINY)
    sae = interp.SAE(TINY.d_model, 32, hook_name=HOOK)
    sae.model_config = {**model_config(model), "n_layers": 7}
    with pytest.raises(ValueError, match="trained for another model: config differs"):
        sae.check_model(model)
