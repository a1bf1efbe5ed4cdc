"""pyvene on a Sprout: a positional interchange intervention (which reads `model.device`) equals the same
patch made with a TransformerLens hook (the interop venv: `.ci/run` builds it)."""
import pytest
import torch

from tests.conftest import TINY, randomize_gains

pyvene = pytest.importorskip("pyvene")

from sprout import Sprout  # noqa: E402


def test_a_positional_interchange_is_the_hooked_patch():
    torch.manual_seed(0)
    model = randomize_gains(Sprout(TINY).eval())
    g = torch.Generator().manual_seed(3)
    base, source = (torch.randint(0, TINY.vocab_size, (1, 8), generator=g) for _ in range(2))
    name, pos = "blocks.0.hook_resid_post", 5
    config = pyvene.IntervenableConfig([{"component": "blocks[0].hook_resid_post.output",
                                         "intervention": pyvene.VanillaIntervention(embed_dim=TINY.d_model)}])
    intervenable = pyvene.IntervenableModel(config, model)
    with torch.no_grad():
        _, got = intervenable({"input": base}, [{"input": source}], unit_locations={"sources->base": ([[[pos]]], [[[pos]]])})
    _, src_cache = model.run_with_cache(source, names_filter=name)

    def patch(x, hook):
        x[:, pos] = src_cache[name][:, pos]
        return x

    want = model.run_with_hooks(base, fwd_hooks=[(name, patch)])
    assert model.device == torch.device("cpu")
    assert torch.equal(got, want)
    assert not torch.equal(got, model(base))
