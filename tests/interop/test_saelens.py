"""SAELens reads every shipped SAE and transcoder and reconstructs as we do; `interp.run_with_saes` takes its
objects (the interop venv: `.ci/run` builds it)."""
import warnings
from pathlib import Path

import pytest
import torch

sae_lens = pytest.importorskip("sae_lens")

import interp  # noqa: E402
import sprout  # noqa: E402
from interp.saes import register_with_saelens  # noqa: E402
from sprout.files import demo_dir  # noqa: E402

# cross-layer transcoders are circuit-tracer's format, not SAELens' (tests/interop/test_circuit_tracer_clt.py)
FOLDERS = sorted(p for p in demo_dir().glob("*/saes/*") if (p / "cfg.json").is_file() and p.name != "clt")


def _ours(folder: Path):
    return (interp.Transcoder if folder.name.startswith("transcoder-") else interp.SAE).load(folder)


def _theirs(folder: Path):
    register_with_saelens()
    return sae_lens.SAE.load_from_disk(str(folder))


def test_every_shipped_dictionary_is_found():
    names = {p.name for p in FOLDERS}
    demos = {"gpt-4": 4, "sprout-mini": 8}  # blocks: a residual SAE each, and a transcoder with and without skip
    assert len(FOLDERS) == 3 * sum(demos.values())
    assert {f"transcoder-{i}{tail}" for i in range(8) for tail in ("", "-noskip")} <= names
    assert all((demo_dir() / demo / "saes" / "clt" / "cfg.json").is_file() for demo in demos)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_saelens_loads_and_reconstructs_as_we_do(folder):
    ours, theirs = _ours(folder), _theirs(folder)
    x = torch.randn(64, ours.d_in, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(theirs.encode(x), ours.encode(x))
        assert torch.equal(theirs(x), ours(x))  # a skip transcoder's forward adds x @ W_skip.T in both


def test_registering_twice_registers_nothing_new():
    register_with_saelens()
    assert register_with_saelens() == []
    assert sae_lens.SAE.get_sae_class_for_architecture("skip_topk_transcoder").__name__ == "SkipTopkTranscoder"


def test_run_with_saes_takes_saelens_objects_and_keeps_the_skip_term():
    model = sprout.load("gpt-4").eval()
    folders = [demo_dir() / "gpt-4" / "saes" / n for n in ("blocks.0.hook_resid_post", "transcoder-1", "transcoder-3")]
    tokens = model.to_tokens("The cat sat on the mat and looked at the door.")
    want_logits, want = interp.run_with_saes(model, tokens, [_ours(f) for f in folders])
    got_logits, got = interp.run_with_saes(model, tokens, [_theirs(f) for f in folders])
    assert torch.allclose(got_logits, want_logits, atol=1e-5, rtol=0)
    name = "blocks.1.ln2.hook_normalized.hook_sae_acts_post"
    assert torch.allclose(got[name], want[name], atol=1e-5, rtol=0)
    assert not torch.allclose(got_logits, model(tokens), atol=1e-3)  # the dictionaries were spliced


def test_a_saelens_transcoder_without_its_output_hook_is_refused_by_name():
    theirs = _theirs(demo_dir() / "gpt-4" / "saes" / "transcoder-1")
    theirs.cfg.metadata.hook_name_out = None
    with pytest.raises(ValueError, match="names no hook_name_out"):
        interp.run_with_saes(sprout.load("gpt-4"), "hi there", [theirs])


def test_saving_a_skip_transcoder_warns_that_saelens_splices_drop_the_term(tmp_path):
    tc = interp.Transcoder(8, 16, kind="batchtopk", k=2, skip=True, layer=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tc.save(tmp_path / "tc")
    assert any("drop a skip transcoder's W_skip term" in str(w.message) for w in seen)
    assert type(_theirs(tmp_path / "tc")).__name__ == "JumpReLUSkipTranscoder"
