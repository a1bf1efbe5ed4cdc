"""to_jumprelu: a BatchTopK dictionary written as JumpReLU gives the same latents and outputs, and saves as jumprelu;
from_jumprelu recovers the BatchTopK dictionary, from its saved folder too, and refuses a JumpReLU trained as such."""
import json

import pytest
import torch

import interp
from interp.saes.convert import from_jumprelu, same_outputs, to_jumprelu


@pytest.mark.parametrize("transcoder", [False, True])
def test_a_batchtopk_dictionary_converts_exactly(tmp_path, transcoder):
    if transcoder:
        sae = interp.Transcoder(16, 40, 16, kind="batchtopk", k=3, skip=True, layer=1, seed=1)
    else:
        sae = interp.SAE(16, 40, kind="batchtopk", k=3, hook_name="blocks.0.hook_resid_post", seed=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(40, generator=g) * 0.3)
        sae.threshold.fill_(0.25)
        if transcoder:
            sae.W_skip.copy_(torch.randn(16, 16, generator=g))
    x = torch.randn(50, 16, generator=g)
    jr = to_jumprelu(sae)
    assert jr.kind == "jumprelu" and jr.threshold.shape == (40,) and type(jr) is type(sae)
    assert same_outputs(sae, jr, x) and 0 < (jr.encode(x) > 0).sum(-1).float().mean() < 40
    assert jr.info["converted_from"] == "batchtopk"
    folder = jr.save(tmp_path / "d")
    cfg = json.loads((folder / "cfg.json").read_text())
    assert "jumprelu" in cfg["architecture"]
    back = type(sae).load(folder)
    assert same_outputs(sae, back, x)
    sae.info["settings"] = {"k": 3}  # what training records
    again = from_jumprelu(type(sae).load(to_jumprelu(sae).save(tmp_path / "e")))
    assert (again.kind, again.k, type(again)) == ("batchtopk", 3, type(sae)) and "converted_from" not in again.info
    assert all(torch.equal(v, sae.state_dict()[k]) for k, v in again.state_dict().items())
    assert same_outputs(again, sae, x) and same_outputs(to_jumprelu(again), jr, x)


def test_from_jumprelu_refuses_what_was_not_batchtopk():
    jr = interp.SAE(8, 16, kind="jumprelu", hook_name="blocks.0.hook_resid_post")
    with pytest.raises(ValueError, match="not converted from a BatchTopK"):
        from_jumprelu(jr)
    sae = interp.SAE(8, 16, kind="batchtopk", k=2, hook_name="blocks.0.hook_resid_post")
    sae.info["settings"] = {"k": 2}
    jr = to_jumprelu(sae)
    with torch.no_grad():
        jr.threshold[3] = 0.7
    with pytest.raises(ValueError, match="thresholds differ"):
        from_jumprelu(jr)


def test_a_topk_dictionary_has_no_threshold_to_convert():
    with pytest.raises(ValueError, match="no inference threshold"):
        to_jumprelu(interp.SAE(8, 16, kind="topk", k=2, hook_name="blocks.0.hook_resid_post"))
