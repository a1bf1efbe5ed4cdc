"""The tuned-lens package reads the lens we write in its format, and we read the one it writes (the interop
venv: `.ci/run` installs tuned-lens 0.2 there without its training dependencies)."""
import pytest
import torch

pytest.importorskip("tuned_lens")
transformers = pytest.importorskip("transformers")

from tuned_lens.nn.lenses import TunedLens as TheirLens  # noqa: E402

import interp  # noqa: E402
import sprout  # noqa: E402
from sprout.files.hf import export  # noqa: E402


def test_tuned_lens_reads_ours_and_we_read_theirs(tmp_path, monkeypatch):
    # tuned-lens 0.2 predates Qwen3: it finds a Llama's final norm by isinstance(base_model, LlamaModel); a
    # Qwen3Model keeps it under the same name (`norm`), so it is let through that test (benchmarks/tuned_lens_peer.py)
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3
    monkeypatch.setattr(modeling_llama, "LlamaModel", (modeling_llama.LlamaModel, modeling_qwen3.Qwen3Model))
    model = sprout.load("sprout-mini").eval()
    ours = interp.load_tuned_lens(model)
    ours.save(tmp_path / "lens", format="tuned-lens")
    hf = transformers.AutoModelForCausalLM.from_pretrained(export(model, tmp_path / "hf"), dtype=torch.float32).eval()
    theirs = TheirLens.from_model_and_pretrained(hf, str(tmp_path / "lens")).eval()
    tokens = model.to_tokens("The cat sat on the mat and looked at the door.")
    _, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        for i, site in enumerate(ours.sites[:-1]):
            h = cache[site]
            want = model.unembed(model.ln_final(ours(i, h)))
            assert torch.allclose(theirs(h, i), want, atol=1e-4, rtol=1e-4), site
        for p in theirs.parameters():
            p.mul_(0.5)
    theirs.save(str(tmp_path / "theirs"))
    back = interp.TunedLens.load(model, tmp_path / "theirs")
    h = torch.randn(2, model.cfg.d_model)
    for i in range(len(back.translators)):
        assert torch.allclose(back(i, h), theirs.transform_hidden(h, i), atol=1e-6)
