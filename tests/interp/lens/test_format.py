"""TunedLens in the tuned-lens package's folder (config.json + params.pt): written, read back, checked."""
import json

import pytest
import torch

import interp


def _trained(model, seed=0):
    lens = interp.TunedLens(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lens.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lens


def test_a_lens_in_tuned_lens_format_reads_back_the_same(tiny_model, tmp_path):
    lens = _trained(tiny_model)
    params = lens.save(tmp_path / "theirs", format="tuned-lens")
    config = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert params.name == "params.pt" and config["lens_type"] == "linear_tuned_lens"
    assert (config["num_hidden_layers"], config["d_model"]) == (len(lens.translators), 64) == (2, 64)
    state = torch.load(params, weights_only=True)
    assert sorted(state) == ["0.bias", "0.weight", "1.bias", "1.weight"]  # their ModuleList's keys
    back = interp.TunedLens.load(tiny_model, tmp_path / "theirs")
    h = torch.randn(3, 64)
    for i in range(len(lens.translators)):
        assert torch.equal(back(i, h), lens(i, h))
        assert torch.allclose(lens(i, h), h + h @ state[f"{i}.weight"].T + state[f"{i}.bias"], atol=1e-6)  # theirs: h + W h + b


def test_a_tuned_lens_folder_of_another_shape_or_kind_is_refused(tiny_model, tmp_path):
    _trained(tiny_model).save(tmp_path / "t", format="tuned-lens")
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    (tmp_path / "t" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5}))
    with pytest.raises(ValueError, match="num_hidden_layers 5 and d_model 64, but this model's lens has 2"):
        interp.TunedLens.load(tiny_model, tmp_path / "t")
    with pytest.raises(ValueError, match="format must be 'sprout' or 'tuned-lens'"):
        _trained(tiny_model).save(tmp_path / "u", format="pickle")
