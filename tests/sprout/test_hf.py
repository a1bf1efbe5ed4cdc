"""Hugging Face bridge: an exported Sprout is a Qwen3ForCausalLM that computes the same thing.

The independent implementation is transformers' Qwen3 (and TransformerLens' TransformerBridge on
top of it); everything runs offline on a tiny random model with non-trivial norm gains and a
non-default RoPE base, so a dropped gain or a wrong theta shows up in the logits.
"""
import dataclasses
import json
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import sprout.files.hf as hf_module
from sprout import Sprout
from sprout.files.checkpoint import load, save
from sprout.files.hf import export, import_
from sprout.tokenizer import train_bpe
from sprout_cli import main as cli
from tests.conftest import TINY, randomize_gains

CFG = dataclasses.replace(TINY, vocab_size=264, rope_base=500.0, context=48)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = randomize_gains(Sprout(CFG).eval())
    m.tokenizer = train_bpe("the cat sat on the mat. " * 20, vocab_size=CFG.vocab_size)
    return m


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory):
    return export(model, tmp_path_factory.mktemp("hf") / "qwen3")


@pytest.fixture(scope="module")
def qwen3(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture
def tokens():
    return torch.randint(0, CFG.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))


# --- export -----------------------------------------------------------------------------------------

def test_export_writes_a_qwen3_folder(folder, qwen3):
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert type(qwen3).__name__ == "Qwen3ForCausalLM"
    c = qwen3.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (CFG.n_head, CFG.n_head, CFG.d_head)
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (CFG.d_model, CFG.d_ff, CFG.n_layer)
    assert c.tie_word_embeddings and c.rms_norm_eps == 1e-6 and not c.attention_bias
    assert c.rope_parameters["rope_theta"] == CFG.rope_base
    assert qwen3.lm_head.weight.data_ptr() == qwen3.model.embed_tokens.weight.data_ptr()  # tied


def test_exported_logits_equal_ours(model, qwen3, tokens):
    with torch.no_grad():
        ours = model(tokens)
        theirs = qwen3(tokens).logits
    assert (ours - theirs).abs().max() <= 1e-5
    assert ours.std() > 0.1  # the comparison is not between two near-constant outputs


def test_greedy_generation_matches(model, qwen3, tokens):
    prompt = tokens[:1, :6]
    with torch.no_grad():
        theirs = qwen3.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        argmax = prompt
        for _ in range(16):
            argmax = torch.cat([argmax, model(argmax, return_type="logits")[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(theirs, argmax)
    assert torch.equal(model.generate(prompt, 16, top_k=1), argmax)


def test_tokenizer_loads_as_pretrained_tokenizer_fast(model, folder):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = AutoTokenizer.from_pretrained(folder)
    assert isinstance(tok, PreTrainedTokenizerFast)
    text = "the mat sat on the cat.<|endoftext|>"
    ids = tok(text).input_ids
    assert ids == model.to_tokens(text)[0].tolist()
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == model.tokenizer.token_to_id("<|endoftext|>")


def test_export_is_atomic_and_will_not_clobber(model, tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export(model, target)
    with pytest.raises(FileExistsError, match=r"refusing to replace .*out.*would delete notes\.txt"):
        export(model, target, overwrite=True)  # overwrite replaces only a folder export wrote
    assert [p.name for p in target.iterdir()] == ["notes.txt"]

    ours = tmp_path / "hf"
    export(model, ours)
    before = {p.name: p.read_bytes() for p in ours.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(hf_module, "safetensors_bytes", disk_full)
    with pytest.raises(OSError, match="No space"):
        export(model, ours, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]  # no temporary folder left behind
    assert {p.name: p.read_bytes() for p in ours.iterdir()} == before  # the old folder is untouched
    monkeypatch.undo()
    export(model, ours, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]
    assert sorted(p.name for p in ours.iterdir()) == sorted(before)


# --- import -----------------------------------------------------------------------------------------

def test_round_trip_is_bit_exact(model, folder):
    back = hf_module.load(folder)
    assert hf_module.import_ is hf_module.load  # the old name still works
    assert back.config == model.config
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
    assert back.head.weight is back.embed.weight
    assert back.tokenizer.to_str() == model.tokenizer.to_str()
    assert not back.training


def test_import_does_not_need_transformers(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # any `import transformers` now fails
    assert import_(folder).config == CFG


def edited_copy(folder, tmp_path, config_edits=None, drop=(), tensors=None):
    """A copy of `folder` with config.json keys changed (None deletes) and tensors added/replaced."""
    out = tmp_path / "edited"
    out.mkdir(parents=True)
    config = json.loads((folder / "config.json").read_text())
    for k, v in (config_edits or {}).items():
        config.pop(k) if v is None else config.__setitem__(k, v)
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    for k in drop:
        del weights[k]
    weights.update(tensors or {})
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("edits, message", [
    ({"model_type": "llama"}, "model_type is 'llama'"),
    ({"num_key_value_heads": 2}, r"grouped KV heads \(num_key_value_heads=2 != num_attention_heads=4\)"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings is not true"),
    ({"tie_word_embeddings": None}, "tie_word_embeddings is not true"),  # Qwen3's default is untied
    ({"use_sliding_window": True, "sliding_window": 16}, "sliding-window attention"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window attention"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0}}, "RoPE scaling of type 'yarn'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "RoPE scaling of type 'linear'"),
    ({"head_dim": 32}, "head_dim=32 but hidden_size / num_attention_heads = 64 / 4"),
    ({"head_dim": None}, "head_dim=128"),  # absent means Qwen3's default of 128
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps=1e-05"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_import_refuses_what_sprout_cannot_represent(folder, tmp_path, edits, message):
    with pytest.raises(ValueError, match="Sprout cannot represent this model: " + message):
        import_(edited_copy(folder, tmp_path, edits))


def test_import_refuses_weights_that_do_not_fit(folder, tmp_path):
    embed = load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    bias = {"model.layers.0.self_attn.q_proj.bias": torch.zeros(CFG.d_model)}
    with pytest.raises(ValueError, match=r"q_proj.bias: unexpected \(a bias, and Sprout has none\)"):
        import_(edited_copy(folder, tmp_path / "a", tensors=bias))
    with pytest.raises(ValueError, match="lm_head.weight: differs from model.embed_tokens.weight"):
        import_(edited_copy(folder, tmp_path / "b", tensors={"lm_head.weight": embed + 1}))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight: missing \(expected \(128, 64\)\)"):
        import_(edited_copy(folder, tmp_path / "c", drop=["model.layers.1.mlp.up_proj.weight"]))
    # A stored lm_head equal to the embedding is just the tie written out: accepted.
    assert import_(edited_copy(folder, tmp_path / "d", tensors={"lm_head.weight": embed.clone()})).config == CFG


# --- TransformerLens' bridge on the exported folder -------------------------------------------------

def test_transformer_bridge_boots_offline_and_matches_our_cache(model, folder, qwen3, tokens):
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=qwen3, device="cpu")
    with torch.no_grad():
        their_logits, theirs = bridge.run_with_cache(tokens)
        our_logits, ours = model.run_with_cache(tokens)
    assert (their_logits - our_logits).abs().max() <= 1e-4
    for l in range(CFG.n_layer):
        for name in (f"blocks.{l}.hook_resid_post", f"blocks.{l}.attn.hook_pattern"):
            assert (theirs[name] - ours[name]).abs().max() <= 1e-4, name
        causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
        name = f"blocks.{l}.attn.hook_attn_scores"  # the masked entries are -inf in ours, a large negative in theirs
        assert (theirs[name][..., causal] - ours[name][..., causal]).abs().max() <= 1e-4
    # Every other hook both name alike holds the same activation (the bridge's q/k_normed are [b, head, pos, d]).
    shared = [k for k in ours.keys() if k in theirs.keys() and "attn_scores" not in k]
    assert len(shared) >= 20 * CFG.n_layer
    for name in shared:
        a, b = theirs[name], ours[name]
        if name.endswith(("q_normed", "k_normed")):
            a = a.transpose(1, 2)
        assert (a - b).abs().max() <= 1e-4, name


# --- command line -----------------------------------------------------------------------------------

def test_cli_round_trip(model, tmp_path, capsys):
    save(model, tmp_path / "ckpt")
    assert cli(["export-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    assert cli(["import-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert "wrote" in capsys.readouterr().out
    back = load(tmp_path / "back")
    assert back.config == model.config
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    assert back.tokenizer.to_str() == model.tokenizer.to_str()


def test_cli_import_refusal_writes_nothing(folder, tmp_path):
    bad = edited_copy(folder, tmp_path, {"num_key_value_heads": 1})
    with pytest.raises(SystemExit, match="sprout import-hf: .*grouped KV heads"):  # one line, no traceback
        cli(["import-hf", str(bad), str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()
