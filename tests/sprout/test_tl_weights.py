"""TransformerLens' weight matrices on Sprout and the walkthrough GPT, each checked against an independent
computation: the activations they must reproduce (fold identities), hand-indexed raw weights, the
weights TransformerLens' own bridge folds from the exported Qwen3, and TransformerLens' own helpers
(`stack_neuron_results`, `expand_neurons=True`, `composition_scores`, `SVDInterpreter`)."""
import logging

import pytest
import torch
from transformer_lens import SVDInterpreter
from transformer_lens.FactoredMatrix import FactoredMatrix

from sprout import Sprout
from sprout.walkthrough import build_step
from tests.conftest import TINY, randomize_gains

L, H, D, DH, F = TINY.n_layer, TINY.n_head, TINY.d_model, TINY.d_head, TINY.d_ff
MODEL_PY_KEYS = (["embed.weight"] + [f"blocks.{l}.{k}.weight" for l in range(L) for k in (
    "norm1", "attn.qkv", "attn.proj", "attn.q_norm", "attn.k_norm", "norm2", "ffn.w1", "ffn.w3", "ffn.w2")]
    + ["norm.weight", "head.weight"])


@pytest.fixture
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


@pytest.fixture
def tokens():
    return torch.randint(0, TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def run(model, tokens):
    return model.run_with_cache(tokens)


def close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


# --- layout and folding -----------------------------------------------------------------------------

def test_shapes_are_transformer_lens(model):
    shapes = {"W_E": (TINY.vocab_size, D), "W_Q": (L, H, D, DH), "W_K": (L, H, D, DH), "W_V": (L, H, D, DH),
              "W_O": (L, H, DH, D), "W_in": (L, D, F), "W_gate": (L, D, F), "W_out": (L, F, D),
              "W_U": (D, TINY.vocab_size), "b_Q": (L, H, DH), "b_K": (L, H, DH), "b_V": (L, H, DH),
              "b_O": (L, D), "b_in": (L, F), "b_out": (L, D), "b_U": (TINY.vocab_size,)}
    for name, shape in shapes.items():
        assert tuple(getattr(model, name).shape) == shape, name
    for name in ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U"):
        assert not getattr(model, name).any(), name  # Sprout has no biases
    assert model.embed.W_E is model.embed.weight
    close(model.unembed.W_U, model.W_U)
    assert model.all_head_labels == [f"L{l}H{h}" for l in range(L) for h in range(H)]
    assert not hasattr(model, "W_pos")  # RoPE: no position table, as TransformerLens has none for rotary models


def test_state_dict_keeps_model_py_keys_and_raw_weights_stay_in_the_modules(model):
    assert list(model.state_dict()) == MODEL_PY_KEYS
    # Hand-indexed: head h's query column i is row h * d_head + i of qkv's first third, times ln1's gain.
    blk = model.blocks[1]
    g1, g2 = blk.norm1.weight, blk.norm2.weight
    for h in range(H):
        for i in (0, DH - 1):
            for part, name in enumerate(("W_Q", "W_K", "W_V")):
                row = blk.attn.qkv.weight[part * D + h * DH + i]
                close(getattr(model, name)[1, h, :, i], g1 * row, atol=0)
            close(model.W_O[1, h, i], blk.attn.proj.weight[:, h * DH + i], atol=0)
    close(model.W_gate[1], (g2[:, None] * blk.ffn.w1.weight.T), atol=0)
    close(model.W_in[1], (g2[:, None] * blk.ffn.w3.weight.T), atol=0)
    close(model.W_out[1], blk.ffn.w2.weight.T, atol=0)
    assert model.blocks[1].mlp.W_out.data_ptr() == blk.ffn.w2.weight.data_ptr()  # a view, not a copy


def test_fold_identities_reproduce_the_activations(model, run):
    logits, cache = run
    for l in range(L):
        x1 = cache[f"blocks.{l}.ln1.hook_normalized"]
        for name in ("q", "k", "v"):
            W = getattr(model.blocks[l].attn, f"W_{name.upper()}")
            close(torch.einsum("bpm,hmd->bphd", x1, W), cache[f"blocks.{l}.attn.hook_{name}"])
        heads = torch.einsum("bphd,hdm->bpm", cache[f"blocks.{l}.attn.hook_z"], model.W_O[l])
        close(heads, cache[f"blocks.{l}.hook_attn_out"])
        x2 = cache[f"blocks.{l}.ln2.hook_normalized"]
        close(x2 @ model.blocks[l].mlp.W_gate, cache[f"blocks.{l}.mlp.hook_pre"])
        close(x2 @ model.blocks[l].mlp.W_in, cache[f"blocks.{l}.mlp.hook_pre_linear"])
        close(cache[f"blocks.{l}.mlp.hook_post"] @ model.W_out[l], cache[f"blocks.{l}.hook_mlp_out"])
    close(cache["ln_final.hook_normalized"] @ model.W_U + model.b_U, logits)


def test_qk_is_the_bilinear_form_of_the_raw_queries_and_keys(model, run):
    # Before QK-norm and RoPE, hook_q . hook_k = x_q QK x_k^T: the fold holds for QK as a whole.
    _, cache = run
    l, h = 1, 2
    x = cache[f"blocks.{l}.ln1.hook_normalized"][0]  # [pos, d_model]
    q, k = cache[f"blocks.{l}.attn.hook_q"][0, :, h], cache[f"blocks.{l}.attn.hook_k"][0, :, h]
    QK = model.QK
    assert isinstance(QK, FactoredMatrix) and QK.shape == (L, H, D, D)
    close(x @ QK[l, h].AB @ x.T, q @ k.T, atol=1e-4)
    v, z_dir = cache[f"blocks.{l}.attn.hook_v"][0, :, h], x @ model.OV[l, h].AB
    close(z_dir, v @ model.W_O[l, h], atol=1e-5)


def test_properties_follow_the_weights_and_carry_gradients(model):
    before = model.W_Q[0].detach().clone()
    with torch.no_grad():
        model.blocks[0].norm1.weight.mul_(2)  # an edit to the raw gain shows in the folded matrix
    close(model.W_Q[0], 2 * before, atol=0)
    model.W_Q.sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad is not None and model.blocks[0].norm1.weight.grad is not None


def test_weights_against_transformer_lens_bridge_folding(model, tmp_path):
    """TransformerLens' own bridge over the exported Qwen3, with fold_ln, folds to the same matrices."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    from sprout.files.hf import export

    logging.disable(logging.WARNING)
    try:
        folder = export(model, tmp_path / "qwen3")
        qwen3 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
        bridge = TransformerBridge.boot_transformers(str(folder), hf_model=qwen3.eval(), device="cpu")
        bridge.enable_compatibility_mode()
    finally:
        logging.disable(logging.NOTSET)
    for name in ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out"):
        close(getattr(model, name), getattr(bridge, name), atol=1e-6)
    # compatibility mode also centres the unembedding over the vocabulary
    close(model.W_U - model.W_U.mean(-1, keepdim=True), bridge.W_U, atol=1e-6)
    theirs = {k for k in bridge.tl_parameters() if not k.endswith(".w")}  # their (unit) norm gains after folding
    assert set(model.tl_parameters()) == theirs


# --- TransformerLens' helpers that read the weights ---------------------------------------------------

def test_stack_neuron_results_are_each_neurons_write(model, run):
    _, cache = run
    stack, labels = cache.stack_neuron_results(layer=L, return_labels=True)
    assert labels == [f"L{l}N{n}" for l in range(L) for n in range(F)]
    for l in range(L):
        post, w2 = cache[f"blocks.{l}.mlp.hook_post"], model.blocks[l].ffn.w2.weight  # w2 [d_model, d_ff]
        for n in (0, 7, F - 1):
            close(stack[l * F + n], post[..., n, None] * w2[:, n])
        close(stack[l * F:(l + 1) * F].sum(0), cache[f"blocks.{l}.hook_mlp_out"])
    one = cache.get_neuron_results(1, neuron_slice=[3, 5])
    close(one, torch.stack([cache["blocks.1.mlp.hook_post"][..., n, None] * model.blocks[1].ffn.w2.weight[:, n]
                            for n in (3, 5)], dim=-2))


def test_full_decomposition_with_neurons_sums_to_the_stream(run):
    _, cache = run
    parts, labels = cache.get_full_resid_decomposition(expand_neurons=True, return_labels=True)
    assert len(labels) == L * H + L * F + 2 and labels[-2:] == ["embed", "bias"]
    close(parts.sum(0), cache[f"blocks.{L - 1}.hook_resid_post"])
    assert not parts[-1].any()  # no biases


def top_singular_directions(matrix: torch.Tensor, W_U: torch.Tensor, n: int) -> torch.Tensor:
    """|W_U^T v_i| for the top n right singular vectors v_i of a dense matrix: [vocab, 1, n] (sign-free)."""
    _, _, Vh = torch.linalg.svd(matrix.double())
    return (W_U.double().T @ Vh[:n].T).abs().unsqueeze(1).float()


def test_svd_interpreter_matches_a_dense_svd(model):
    svd = SVDInterpreter(model)
    with torch.no_grad():
        W_U = model.W_U
        ov = svd.get_singular_vectors("OV", layer_index=1, head_index=2, num_vectors=3)
        close(ov.abs(), top_singular_directions(model.W_V[1, 2] @ model.W_O[1, 2], W_U, 3), atol=1e-4)
        w_in = svd.get_singular_vectors("w_in", layer_index=0, num_vectors=4)
        close(w_in.abs(), top_singular_directions(model.W_in[0].T, W_U, 4), atol=1e-4)
        w_out = svd.get_singular_vectors("w_out", layer_index=1, num_vectors=4)
        close(w_out.abs(), top_singular_directions(model.W_out[1], W_U, 4), atol=1e-4)


# --- the walkthrough GPT: biases, learned positions, LayerNorm -----------------------------------------

@pytest.fixture
def walkthrough():
    torch.manual_seed(0)
    model = build_step("4.10").eval()
    with torch.no_grad():  # LayerNorms start at gain 1, bias 0: move them so folding shows
        for name, p in model.named_parameters():
            if name.startswith(("blocks", "ln_final")) and p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_walkthrough_fold_identities_with_biases(walkthrough):
    m = walkthrough
    tokens = torch.randint(0, 65, (2, 8), generator=torch.Generator().manual_seed(1))
    logits, cache = m.run_with_cache(tokens)
    assert m.W_pos is m.pos_embed.weight and m.W_E_pos.shape == (65 + 8, 32)
    close(cache["hook_pos_embed"][0], m.W_pos[:8])
    for l in range(m.cfg.n_layers):
        x1, blk = cache[f"blocks.{l}.ln1.hook_normalized"], m.blocks[l]
        for name in ("q", "k", "v"):
            W, b = getattr(m, f"W_{name.upper()}")[l], getattr(m, f"b_{name.upper()}")[l]
            close(torch.einsum("bpm,hmd->bphd", x1, W) + b, cache[f"blocks.{l}.attn.hook_{name}"])
        attn = torch.einsum("bphd,hdm->bpm", cache[f"blocks.{l}.attn.hook_z"], m.W_O[l]) + m.b_O[l]
        close(attn, cache[f"blocks.{l}.hook_attn_out"])
        close(cache[f"blocks.{l}.ln2.hook_normalized"] @ m.W_in[l] + m.b_in[l], cache[f"blocks.{l}.mlp.hook_pre"])
        close(cache[f"blocks.{l}.mlp.hook_post"] @ m.W_out[l] + m.b_out[l], cache[f"blocks.{l}.hook_mlp_out"])
        close(m.b_O[l], blk.attn.projection.bias, atol=0)
    close(cache["ln_final.hook_normalized"] @ m.W_U + m.b_U, logits)
    assert m.W_gate is None and "pos_embed.W_pos" in m.tl_parameters()


def test_walkthrough_decomposition_with_neurons_and_biases(walkthrough):
    _, cache = walkthrough.run_with_cache(torch.randint(0, 65, (1, 8), generator=torch.Generator().manual_seed(2)))
    parts, labels = cache.get_full_resid_decomposition(expand_neurons=True, return_labels=True)
    assert labels[-3:] == ["embed", "pos_embed", "bias"]
    close(parts.sum(0), cache[f"blocks.{walkthrough.cfg.n_layers - 1}.hook_resid_post"])
    m = walkthrough
    close(parts[-1, 0, 0], sum(m.blocks[l].attn.projection.bias + m.blocks[l].mlp.fc2.bias for l in range(3)))


def test_walkthrough_steps_without_norms_or_mlp(tokens):
    torch.manual_seed(0)
    m = build_step("4.2").eval()  # one attention on the embedding, no norm, no feed-forward
    logits, cache = m.run_with_cache(torch.randint(0, 65, (1, 8)))
    close(cache["blocks.0.attn.hook_q"], torch.einsum("bpm,hmd->bphd", cache["hook_embed"] + cache["hook_pos_embed"],
                                                      m.W_Q[0]))
    close(cache["blocks.0.hook_attn_out"] @ m.W_U + m.b_U, logits)  # no final norm: nothing folded
    with pytest.raises(AttributeError):
        m.W_in
    assert not m.tl_parameters()["blocks.0.mlp.W_in"].any()  # zeros, as TransformerLens gives attention-only layers
    SVDInterpreter(m).get_singular_vectors("OV", layer_index=0, head_index=1, num_vectors=2)


def test_a_copied_model_reads_its_own_weights(model):
    import copy

    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.blocks[1].norm2.weight.zero_()
        twin.blocks[1].ffn.w2.weight.zero_()
    assert not twin.W_in[1].any() and not twin.blocks[1].mlp.W_out.any()
    assert model.W_in[1].any() and model.blocks[1].mlp.W_out.any()


def test_walkthrough_extra_projections_fold_into_the_writes():
    torch.manual_seed(0)
    m = build_step("4.8").eval()  # Linear(C, C) after the attention and after the feed-forward layer
    _, cache = m.run_with_cache(torch.randint(0, 65, (2, 8), generator=torch.Generator().manual_seed(4)))
    for l in range(m.cfg.n_layers):
        attn = torch.einsum("bphd,hdm->bpm", cache[f"blocks.{l}.attn.hook_z"], m.W_O[l]) + m.b_O[l]
        close(attn, cache[f"blocks.{l}.hook_attn_out"])
        close(cache[f"blocks.{l}.mlp.hook_post"] @ m.W_out[l] + m.b_out[l], cache[f"blocks.{l}.hook_mlp_out"])
    parts = cache.get_full_resid_decomposition(expand_neurons=True)
    close(parts.sum(0), cache[f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"])
