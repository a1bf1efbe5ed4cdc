"""TransformerLens' own tools on a Sprout, each checked against an independent computation."""
import pytest
import torch
from transformer_lens import head_detector, patching
from transformer_lens.config import TransformerLensConfig

from sprout import Sprout
from sprout.tokenizer import train_bpe
from tests.conftest import TINY, randomize_gains

_protocols = pytest.importorskip("transformer_lens.model_protocol", reason="TransformerLens 4's protocols (this has 3.x)")
TransformerLensModel, TransformerLensModelWithWeights = _protocols.TransformerLensModel, _protocols.TransformerLensModelWithWeights

EPS = 1e-6
TEXT = "the cat sat. the cat sat."  # 25 byte tokens with repeats: duplicate and induction targets exist


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = randomize_gains(Sprout(TINY).eval())
    m.tokenizer = train_bpe("abc", vocab_size=256, special_tokens=())  # the 256 bytes, one id each
    return m


@pytest.fixture
def tokens():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, TINY.vocab_size, (2, 10), generator=g)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 7) % TINY.vocab_size  # one position differs
    return clean, corrupted


def logit_of(token: int):
    return lambda logits: logits[:, -1, token].mean()


# --- the protocol -----------------------------------------------------------------------------------

def test_sprout_satisfies_the_protocols(model):
    assert isinstance(model, TransformerLensModel)
    assert isinstance(model, TransformerLensModelWithWeights)
    cfg = model.cfg
    assert isinstance(cfg, TransformerLensConfig)
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx) == (
        TINY.n_layer, TINY.n_head, TINY.d_model, TINY.d_head, TINY.d_ff, TINY.vocab_size, TINY.context)
    assert (cfg.normalization_type, cfg.positional_embedding_type, cfg.act_fn, cfg.gated_mlp) == (
        "RMS", "rotary", "silu", True)


# --- head_detector ----------------------------------------------------------------------------------

def direct_head_score(pattern: torch.Tensor, ids: list, kind: str) -> torch.Tensor:
    """Fraction of each head's attention on its kind's targets: pattern [head, q, k] -> [head]."""
    T = len(ids)
    target = torch.zeros(T, T)
    for q in range(T):
        for k in range(q + 1):
            if kind == "previous_token_head":
                target[q, k] = k == q - 1
            elif kind == "duplicate_token_head":
                target[q, k] = k < q and ids[k] == ids[q]
            else:  # induction: attend to the token after an earlier copy of the current one
                target[q, k] = k >= 1 and ids[k - 1] == ids[q]
    return (pattern * target).sum((-2, -1)) / pattern.sum((-2, -1))


@pytest.mark.parametrize("kind", ["previous_token_head", "duplicate_token_head", "induction_head"])
def test_detect_head_matches_a_direct_computation(model, kind):
    ids = model.to_tokens(TEXT)[0].tolist()
    _, cache = model.run_with_cache(TEXT)
    scores = head_detector.detect_head(model, TEXT, kind)
    assert scores.shape == (TINY.n_layer, TINY.n_head)
    for l in range(TINY.n_layer):
        ours = direct_head_score(cache[f"blocks.{l}.attn.hook_pattern"][0], ids, kind)
        torch.testing.assert_close(scores[l], ours, atol=1e-5, rtol=0)
    assert (scores > 0).all()  # the text has targets of every kind, so no score is trivially 0


def test_detect_head_reads_a_hand_made_pattern(model):
    # Overwrite every pattern with "attend to the previous token": every head must score exactly 1.
    T = len(model.to_tokens(TEXT)[0])
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1

    def force(pattern, hook):
        return prev.expand_as(pattern).clone()

    hooks = [(f"blocks.{l}.attn.hook_pattern", force) for l in range(TINY.n_layer)]
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(TEXT, remove_batch_dim=True)
    assert not cache.has_batch_dim
    scores = head_detector.detect_head(model, TEXT, "previous_token_head", cache=cache)
    torch.testing.assert_close(scores, torch.full_like(scores, (T - 1) / T))  # row 0 has no previous token


# --- activation patching ----------------------------------------------------------------------------

def manual_patch(model, corrupted, clean_cache, name, index, metric):
    def hook(act, hook):
        act = act.clone()
        act[index] = clean_cache[name][index]
        return act

    return metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, hook)]))


def test_resid_pre_patching_matches_manual_hooks(model, tokens):
    clean, corrupted = tokens
    target = int(clean[0, -1])
    metric = logit_of(target)
    _, clean_cache = model.run_with_cache(clean)
    result = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert result.shape == (TINY.n_layer, clean.shape[1])
    for l in range(TINY.n_layer):
        for pos in range(clean.shape[1]):
            want = manual_patch(model, corrupted, clean_cache, f"blocks.{l}.hook_resid_pre",
                                (slice(None), pos), metric)
            torch.testing.assert_close(result[l, pos], want, atol=1e-5, rtol=0)
    # Known answers: at layer 0 only the differing position carries any change, and patching it
    # restores the clean run exactly (the stream at layer 0 is the embedding and nothing else).
    corrupted_metric = metric(model(corrupted, return_type="logits"))
    clean_metric = metric(model(clean, return_type="logits"))
    same = [p for p in range(clean.shape[1]) if p != 3]
    torch.testing.assert_close(result[0, same], corrupted_metric.expand(len(same)), atol=1e-5, rtol=0)
    torch.testing.assert_close(result[0, 3], clean_metric, atol=1e-5, rtol=0)
    assert (clean_metric - corrupted_metric).abs() > 1e-4  # the corruption matters at all


def test_head_patching_matches_manual_hooks(model, tokens):
    clean, corrupted = tokens
    metric = logit_of(int(clean[0, -1]))
    _, clean_cache = model.run_with_cache(clean)
    all_pos = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
    by_pos = patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)
    assert all_pos.shape == (TINY.n_layer, TINY.n_head)
    assert by_pos.shape == (TINY.n_layer, clean.shape[1], TINY.n_head)
    for l in range(TINY.n_layer):
        for h in range(TINY.n_head):
            name = f"blocks.{l}.attn.hook_z"
            want = manual_patch(model, corrupted, clean_cache, name, (slice(None), slice(None), h), metric)
            torch.testing.assert_close(all_pos[l, h], want, atol=1e-5, rtol=0)
            for pos in (0, 3, clean.shape[1] - 1):
                want = manual_patch(model, corrupted, clean_cache, name, (slice(None), pos, h), metric)
                torch.testing.assert_close(by_pos[l, pos, h], want, atol=1e-5, rtol=0)
    # Before the differing position, layer 0 heads see identical inputs: patching them changes nothing.
    corrupted_metric = metric(model(corrupted, return_type="logits"))
    torch.testing.assert_close(by_pos[0, :3], corrupted_metric.expand(3, TINY.n_head), atol=1e-5, rtol=0)


# --- ActivationCache helpers ------------------------------------------------------------------------

def rms_normalize(x):
    return x / (x.pow(2).mean(-1, keepdim=True) + EPS).sqrt()


@pytest.fixture
def run(model, tokens):
    clean, _ = tokens
    logits, cache = model.run_with_cache(clean)
    return logits, cache


def test_accumulated_resid_with_final_norm(model, run):
    logits, cache = run
    stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels == [f"{l}_pre" for l in range(TINY.n_layer)] + ["final_post"]
    raw = [cache[f"blocks.{l}.hook_resid_pre"] for l in range(TINY.n_layer)]
    raw.append(cache[f"blocks.{TINY.n_layer - 1}.hook_resid_post"])
    for got, x in zip(stack, raw):
        torch.testing.assert_close(got, rms_normalize(x), atol=1e-5, rtol=1e-5)
    # The last entry is the final norm's own output, and with the gain (folded into W_U) the logits.
    torch.testing.assert_close(stack[-1], cache["ln_final.hook_normalized"], atol=1e-6, rtol=0)
    torch.testing.assert_close(stack[-1] @ model.W_U, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.W_U, model.norm.weight[:, None] * model.embed.weight.T)


def test_accumulated_resid_at_a_layer_uses_that_layers_cached_scale(run):
    _, cache = run
    stack = cache.accumulated_resid(layer=1, apply_ln=True)
    scale = cache["blocks.1.ln1.hook_scale"]
    assert stack.shape[0] == 2
    torch.testing.assert_close(stack[0], cache["blocks.0.hook_resid_pre"] / scale)
    torch.testing.assert_close(stack[1], cache["blocks.1.ln1.hook_normalized"], atol=1e-6, rtol=0)


def test_decompose_resid_sums_to_the_stream(run):
    _, cache = run
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed"] + [f"{l}_{k}_out" for l in range(TINY.n_layer) for k in ("attn", "mlp")]
    final = cache[f"blocks.{TINY.n_layer - 1}.hook_resid_post"]
    torch.testing.assert_close(parts.sum(0), final, atol=1e-5, rtol=0)  # no biases: nothing left over
    scaled = cache.decompose_resid(apply_ln=True)
    torch.testing.assert_close(scaled, parts / cache["ln_final.hook_scale"])
    torch.testing.assert_close(scaled.sum(0), cache["ln_final.hook_normalized"], atol=1e-5, rtol=0)


def test_stack_head_results_sum_to_attn_out(model, tokens, run):
    _, cache = run
    heads, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{l}H{h}" for l in range(TINY.n_layer) for h in range(TINY.n_head)]
    per_layer = heads.view(TINY.n_layer, TINY.n_head, *heads.shape[1:])
    for l in range(TINY.n_layer):
        torch.testing.assert_close(per_layer[l].sum(0), cache[f"blocks.{l}.hook_attn_out"], atol=1e-5, rtol=0)
        z, W = cache[f"blocks.{l}.attn.hook_z"], model.blocks[l].attn.proj.weight  # W [d_model, head*d_head]
        for h in range(TINY.n_head):
            d = slice(h * TINY.d_head, (h + 1) * TINY.d_head)
            torch.testing.assert_close(per_layer[l, h], z[:, :, h] @ W[:, d].T, atol=1e-5, rtol=0)
    # A cache without hook_result rebuilds the heads' results from hook_z and W_O.
    _, lean = model.run_with_cache(tokens[0], names_filter=lambda n: not n.endswith("hook_result"))
    torch.testing.assert_close(lean.stack_head_results(), heads, atol=1e-5, rtol=0)


def test_logit_attrs_sum_to_the_logits(model, tokens, run):
    logits, cache = run
    clean, _ = tokens
    parts = cache.decompose_resid()  # logit_attrs applies the final norm's cached scale itself
    target = clean[:, -1]  # one token per example, read at every position
    attrs = cache.logit_attrs(parts, target)
    assert attrs.shape == (parts.shape[0], *clean.shape)
    want = logits.gather(-1, target[:, None, None].expand(-1, clean.shape[1], 1))[..., 0]
    torch.testing.assert_close(attrs.sum(0), want, atol=1e-4, rtol=0)
    # Against another token the attributions sum to the logit difference; a string names a token.
    other = model.to_string(torch.tensor([65]))
    diff = cache.logit_attrs(parts, 66, incorrect_tokens=other)
    torch.testing.assert_close(diff.sum(0), logits[..., 66] - logits[..., 65], atol=1e-4, rtol=0)


def test_logit_lens_reproduces_the_logits(model, run):
    logits, cache = run
    lens = cache.logit_lens(positions=None)
    final = lens.values[-1]
    torch.testing.assert_close(final, logits, atol=1e-5, rtol=1e-5)
    first = rms_normalize(cache["blocks.0.hook_resid_pre"]) @ model.W_U
    torch.testing.assert_close(lens.values[0], first, atol=1e-5, rtol=1e-5)


def test_full_resid_decomposition_without_neurons(run):
    _, cache = run
    parts, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    assert labels[-2:] == ["embed", "bias"]
    final = cache[f"blocks.{TINY.n_layer - 1}.hook_resid_post"]
    torch.testing.assert_close(parts.sum(0), final, atol=1e-5, rtol=0)


# The neuron-level helpers (stack_neuron_results, expand_neurons=True) are in test_tl_weights.py.


# --- the same helpers on TransformerLens' own bridge ------------------------------------------------

def test_helpers_agree_with_transformer_bridge_in_compatibility_mode(model, run, tokens, tmp_path):
    """The bridge over the exported Qwen3, with the norm gains folded into W_U, is the reference."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    from sprout.files.hf import export

    folder = export(model, tmp_path / "qwen3")
    qwen3 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=qwen3.eval(), device="cpu")
    bridge.enable_compatibility_mode()  # fold_ln: the gains move into W_U, as in our W_U
    clean, _ = tokens
    logits, ours = run
    with torch.no_grad():
        their_logits, theirs = bridge.run_with_cache(clean)
    # compatibility mode centres the unembedding, which shifts each position's logits by a constant
    torch.testing.assert_close(their_logits.log_softmax(-1), logits.log_softmax(-1), atol=1e-5, rtol=0)
    for helper in ("accumulated_resid", "decompose_resid", "stack_head_results"):
        a, b = getattr(theirs, helper)(apply_ln=True), getattr(ours, helper)(apply_ln=True)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=helper)
    a = theirs.logit_attrs(theirs.decompose_resid(), 66, incorrect_tokens=65)
    b = ours.logit_attrs(ours.decompose_resid(), 66, incorrect_tokens=65)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)  # a difference of two logits: the centring cancels
    for kind in ("previous_token_head", "induction_head"):
        torch.testing.assert_close(head_detector.detect_head(bridge, TEXT, kind),
                                   head_detector.detect_head(model, TEXT, kind), atol=1e-5, rtol=0)
