"""TransformerLens' tests/integration/test_stop_at_layer.py and test_start_at_layer.py, on Sprout and the
walkthrough GPT (TL's 3-layer model; `hook_pos_embed` is asserted only where the model has learned
positions: Sprout uses RoPE). TL's `torch.allclose` gets atol 1e-6: a cache hooks the norms, which then run
unfused and round differently in float32 from the unhooked forward (the walkthrough's LayerNorm)."""
import functools

import pytest
import torch

allclose = functools.partial(torch.allclose, atol=1e-6)


@pytest.fixture(params=["small", "walk"])
def model(request):
    return request.getfixturevalue(request.param)


def pos_hooks(model):
    return ["hook_embed"] + (["hook_pos_embed"] if "hook_pos_embed" in model.hook_dict else [])


def test_stop_at_embed(model, ids):
    _, normal = model.run_with_cache(ids)
    output, cache = model.run_with_cache(ids, stop_at_layer=0)
    assert allclose(output, normal["blocks.0.hook_resid_pre"])
    assert all(name in cache.keys() for name in pos_hooks(model))
    assert "blocks.0.hook_resid_pre" not in cache.keys()
    assert "ln_final.hook_normalized" not in cache.keys()


def test_stop_run_with_hooks_fires_only_the_blocks_that_run(model, ids):
    counted = []
    output = model.run_with_hooks(ids, stop_at_layer=1, fwd_hooks=[
        (name, lambda act, hook: counted.append(hook.name))
        for name in ("hook_embed", "blocks.0.attn.hook_k", "blocks.1.mlp.hook_pre")])
    _, normal = model.run_with_cache(ids, stop_at_layer=1)
    assert allclose(output, normal["blocks.0.hook_resid_post"])
    assert counted == ["hook_embed", "blocks.0.attn.hook_k"]


def test_stop_with_manual_hooks_and_a_negative_layer(model, ids):
    _, normal = model.run_with_cache(ids)
    counted = []
    count = lambda act, hook: counted.append(hook.name)  # noqa: E731
    for point in (model.hook_embed, model.blocks[0].hook_mlp_out, model.blocks[1].hook_resid_mid,
                  model.blocks[2].attn.hook_z):
        point.add_hook(count)
    try:
        output = model(ids, stop_at_layer=-1, return_type="logits")
    finally:
        model.reset_hooks()
    assert allclose(output, normal["blocks.1.hook_resid_post"])
    assert len(counted) == 3


@pytest.mark.parametrize("stop", [1, -2])
def test_stop_at_layer_1_caches_block_0_only(model, ids, stop):
    _, normal = model.run_with_cache(ids)
    output, cache = model.run_with_cache(ids, stop_at_layer=stop)
    assert allclose(output, normal["blocks.0.hook_resid_post"])
    for key in cache.keys():
        assert key.startswith("blocks.0.") or key in pos_hooks(model), f"unexpected key {key}"
    assert "blocks.0.hook_resid_pre" in cache.keys() and "blocks.0.hook_resid_post" in cache.keys()
    assert "blocks.1.hook_resid_pre" not in cache.keys() and "ln_final.hook_normalized" not in cache.keys()


def test_stop_at_final(model, ids):
    _, normal = model.run_with_cache(ids)
    output, cache = model.run_with_cache(ids, stop_at_layer=-1)
    assert allclose(output, normal["blocks.1.hook_resid_post"])
    assert {"blocks.1.hook_resid_post", "blocks.0.hook_resid_pre"} <= set(cache.keys())
    assert "blocks.2.hook_resid_pre" not in cache.keys() and "ln_final.hook_normalized" not in cache.keys()


def test_no_stop_gives_logits(model, ids):
    output = model(ids, stop_at_layer=None, return_type="logits")
    assert output.shape == (2, 8, 50)
    assert model(ids, stop_at_layer=None, return_type=None) is None


@pytest.fixture
def embed(model, ids):
    residual, tokens, shortformer, mask = model.input_to_embed(ids)
    assert torch.equal(tokens, ids) and shortformer is None and mask is None
    return residual


def test_start_at_layer_1(model, embed):
    output, cache = model.run_with_cache(embed, start_at_layer=1)
    assert output is not None
    assert not set(pos_hooks(model)) & set(cache.keys())
    assert "blocks.0.hook_resid_pre" not in cache.keys()
    assert "blocks.1.hook_resid_pre" in cache.keys() and "ln_final.hook_normalized" in cache.keys()


def test_start_run_with_hooks(model, embed):
    counted = []
    model.run_with_hooks(embed, start_at_layer=1, fwd_hooks=[
        (name, lambda act, hook: counted.append(1)) for name in
        ("hook_embed", "blocks.0.attn.hook_k", "blocks.1.mlp.hook_pre", "blocks.2.attn.hook_k", "blocks.2.mlp.hook_pre")])
    assert len(counted) == 3


def test_start_with_manual_hooks_and_a_negative_layer(model, embed):
    counted = []
    count = lambda act, hook: counted.append(1)  # noqa: E731
    for point in (model.hook_embed, model.blocks[0].hook_mlp_out, model.blocks[1].hook_resid_mid,
                  model.blocks[2].attn.hook_z):
        point.add_hook(count)
    try:
        assert model(embed, start_at_layer=-2, return_type="logits") is not None
    finally:
        model.reset_hooks()
    assert len(counted) == 2


def test_start_at_final(model, embed):
    _, cache = model.run_with_cache(embed, start_at_layer=-1)
    assert "blocks.1.hook_resid_post" not in cache.keys()
    assert {"blocks.2.hook_resid_pre", "blocks.2.hook_resid_post", "ln_final.hook_normalized"} <= set(cache.keys())


def test_start_and_stop(model, embed):
    output, cache = model.run_with_cache(embed, start_at_layer=1, stop_at_layer=2)
    assert allclose(output, cache["blocks.1.hook_resid_post"])
    assert {k.split(".")[1] for k in cache.keys()} == {"1"}


def test_start_equals_the_full_forward(model, ids, embed):
    full = model(ids, return_type="logits")
    torch.testing.assert_close(model(embed, start_at_layer=0, return_type="logits"), full, rtol=0, atol=1e-6)
    mid = model(ids, stop_at_layer=2)
    torch.testing.assert_close(model(mid, start_at_layer=-1, return_type="logits"), full, rtol=0, atol=1e-6)
    # a loss from the stream, as TransformerLens: tokens= are the input's ids
    loss = model(mid, start_at_layer=2, tokens=ids, return_type="loss")
    torch.testing.assert_close(loss, model(ids, return_type="loss"), rtol=0, atol=1e-6)


def test_a_start_after_the_stop_is_refused(model, embed):
    with pytest.raises(ValueError, match="comes after stop_at_layer"):
        model(embed, start_at_layer=2, stop_at_layer=1)
    with pytest.raises(ValueError, match="comes after stop_at_layer"):
        model(embed, start_at_layer=-1, stop_at_layer=-2)
