"""circuit-tracer's own loader reads our exported transcoder sets and reconstructs as we do (the interop
venv: `.ci/run` builds it)."""
import pytest
import torch
import yaml

pytest.importorskip("circuit_tracer")

from circuit_tracer.transcoder import load_transcoder_set  # noqa: E402

from interp.saes import save_circuit_tracer  # noqa: E402
from tests.conftest import TINY  # noqa: E402
from tests.interp.saes.test_transcoder_sets import _inputs, _set  # noqa: E402


@pytest.mark.parametrize("kinds", [("jumprelu", "batchtopk"), ("relu", "jumprelu")])
def test_circuit_tracers_loader_gives_our_reconstructions(tiny_model, tmp_path, kinds):
    tcs = _set(list(kinds), [96, 128])
    folder = save_circuit_tracer(tcs, tmp_path / "ct", tiny_model)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    paths = {layer: str(folder / f"layer_{layer}.safetensors") for layer in range(TINY.n_layer)}
    theirs = load_transcoder_set(paths, scan=config["scan"], feature_input_hook=config["feature_input_hook"],
                                 feature_output_hook=config["feature_output_hook"], device=torch.device("cpu"),
                                 dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)
    assert theirs.skip_connection and theirs.d_transcoder == 128
    for layer, ours in enumerate(tcs):
        x = _inputs(tiny_model, layer)
        x_mlp_in = x * tiny_model.blocks[layer].norm2.weight.detach()  # circuit-tracer's mlp.hook_in
        with torch.no_grad():
            acts = theirs.encode_layer(x_mlp_in, layer)
            assert torch.equal(acts[..., :ours.d_sae] != 0, ours.encode(x) != 0)
            assert not acts[..., ours.d_sae:].any()  # the padding never fires
            assert torch.allclose(theirs[layer](x_mlp_in), ours(x), atol=1e-5, rtol=1e-5)
