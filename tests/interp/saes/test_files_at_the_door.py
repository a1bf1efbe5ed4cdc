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
