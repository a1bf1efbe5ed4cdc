"""Hugging Face bridge: a Sprout is a Qwen3ForCausalLM with one key/value head per query head.

Qwen3 has everything Sprout has (pre-norm RMSNorm with eps 1e-6, per-head QK-RMSNorm before RoPE,
split-half rotary pairs, SwiGLU, no biases, tied embeddings), so an exported folder loads with
`AutoModelForCausalLM.from_pretrained` and gives the same logits. The mapping is one rename per
tensor, except that Sprout's fused `attn.qkv` is Qwen3's `q_proj`, `k_proj`, `v_proj` stacked by rows.

Neither direction needs `transformers`: config.json is plain JSON and the weights are safetensors.
A Qwen3 config that Sprout cannot represent (grouped KV heads, biases, untied embeddings, a sliding
window, RoPE scaling, another head size or norm epsilon) is refused with the reason, never
approximated.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes
from tokenizers import Tokenizer

from ..config import SproutConfig
from ..model import Sprout
from ..names import block
from .checkpoint import from_state_dict, save
from .checkpoint import load as load_checkpoint
from .fit import layers_present
from .folders import write_bytes, write_folder
from .weightfiles import check_fields, file_in, read_json_file, read_safetensors, regular_file

PathLike = Union[str, os.PathLike]

EXPORT_FILES = frozenset({"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
EXPORT_MARK = {"written_by": "sprout export-hf"}  # in the safetensors header: a folder `export` may replace
EPS = 1e-6  # Sprout's RMSNorm epsilon, fixed in model.py
EOT = "<|endoftext|>"

# Sprout key inside blocks.{l}. -> Qwen3 key inside model.layers.{l}. (qkv is handled apart)
LAYER_KEYS = {
    "norm1.weight": "input_layernorm.weight",
    "attn.proj.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


# --- Sprout -> Qwen3 ------------------------------------------------------------------------------

def qwen3_config(cfg: SproutConfig, tokenizer: Tokenizer | None = None,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The config.json of the Qwen3ForCausalLM that computes what a Sprout with `cfg` computes."""
    eos = tokenizer.token_to_id(EOT) if tokenizer is not None else None
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_head,  # plain multi-head attention: no grouped KV
        "head_dim": cfg.d_head,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": EPS,
        # transformers >= 5 reads rope_parameters, 4.x reads rope_theta; write both.
        "rope_theta": float(cfg.rope_base),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_base)},
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * cfg.n_layer,
        "tie_word_embeddings": True,
        "bos_token_id": None,  # Sprout is trained without a BOS token
        "eos_token_id": eos,
        "pad_token_id": None,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
    }


def to_qwen3(model: Sprout) -> dict[str, torch.Tensor]:
    """Sprout's weights under Qwen3's names (CPU, contiguous, no shared storage; lm_head is tied)."""
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    d_model = model.config.d_model
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    for l in range(model.config.n_layer):
        ours, theirs = block(l), f"model.layers.{l}."
        for name, hf_name in LAYER_KEYS.items():
            out[theirs + hf_name] = sd[ours + name]
        for hf_name, w in zip(QKV, sd[ours + "attn.qkv.weight"].split(d_model, dim=0)):
            out[theirs + hf_name] = w
    return {k: v.clone().contiguous() for k, v in out.items()}  # safetensors refuses shared views


def tokenizer_config(tokenizer: Tokenizer, context: int) -> dict[str, Any]:
    """tokenizer_config.json for loading tokenizer.json as a `PreTrainedTokenizerFast`."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,  # decode(encode(text)) must give the text back
        "add_bos_token": False,
        "add_eos_token": False,
    }
    if tokenizer.token_to_id(EOT) is not None:
        config["eos_token"] = EOT
    return config


def export(model: Sprout, directory: PathLike, overwrite: bool = False) -> Path:
    """Write `model` as a Hugging Face Qwen3ForCausalLM folder.

    The folder holds config.json, model.safetensors and, when the model has a tokenizer,
    tokenizer.json and tokenizer_config.json (a `PreTrainedTokenizerFast`). It is written to a
    temporary sibling and renamed into place, so a failure leaves no half-written folder.

    Args:
        model: the Sprout to export (any device and dtype; weights are written in their dtype).
        directory: the folder to create.
        overwrite: replace `directory` if it is a folder `export` wrote before (only those four files,
            and our mark in the safetensors header). Any other folder is never replaced: the error
            names the files that would have been lost.

    Returns:
        The folder written.
    """
    directory = Path(directory)
    if os.path.lexists(directory) and not overwrite:
        if not directory.is_dir():
            raise FileExistsError(f"{directory} exists and is not a folder")
        if any(directory.iterdir()):
            raise FileExistsError(f"{directory} exists and is not empty; choose a new folder, or pass "
                                  "overwrite=True (--overwrite) to replace a folder exported before")
    tok = getattr(model, "tokenizer", None)
    dtype = model.embed.weight.dtype

    def fill(tmp: Path) -> None:
        _write_json(tmp / "config.json", qwen3_config(model.config, tok, dtype))
        # bytes written by us, not safetensors' save_file, which makes the file 0600 whatever the umask
        write_bytes(tmp / "model.safetensors", safetensors_bytes(to_qwen3(model), metadata={"format": "pt", **EXPORT_MARK}))
        if tok is not None:
            tok.save(str(tmp / "tokenizer.json"))
            _write_json(tmp / "tokenizer_config.json", tokenizer_config(tok, model.config.context))

    return write_folder(directory, fill, EXPORT_FILES, _exported_here, "a Hugging Face folder exported by Sprout")


def _exported_here(directory: Path) -> bool:
    """Whether model.safetensors carries the mark `export` writes into its header."""
    try:
        with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception:  # absent or unreadable: not provably ours
        return False
    return all(metadata.get(k) == v for k, v in EXPORT_MARK.items())


def _write_json(path: Path, obj: dict) -> None:
    write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


# --- Qwen3 -> Sprout ------------------------------------------------------------------------------

# The config.json fields we read, and their JSON types: anything else is tampering, named by field.
FIELDS = {
    "model_type": "str|none", "architectures": "list|none", "vocab_size": "int", "hidden_size": "int",
    "intermediate_size": "int", "num_hidden_layers": "int", "num_attention_heads": "int",
    "num_key_value_heads": "int|none", "head_dim": "int|none", "max_position_embeddings": "int",
    "rms_norm_eps": "number", "hidden_act": "str", "rope_theta": "number|none", "rope_parameters": "dict|none",
    "rope_scaling": "dict|none", "attention_bias": "bool", "use_sliding_window": "bool", "layer_types": "list|none",
    "tie_word_embeddings": "bool", "quantization_config": "dict|none",
}
# Declarations that a model needs code of its own (transformers runs it only with trust_remote_code=True):
# Sprout runs no code from a folder, and it computes only Qwen3, so such a folder is refused, never half-read.
CUSTOM_CODE = ("auto_map", "trust_remote_code", "custom_pipelines")


def sprout_config(hf: dict[str, Any], source: str = "config.json") -> SproutConfig:
    """The SproutConfig equal to a Qwen3 config, or ValueError naming what Sprout cannot represent."""
    def refuse(why: str):
        raise ValueError(f"{source}: Sprout cannot represent this model: {why}")

    check_fields(hf, FIELDS, source)
    custom = [k for k in CUSTOM_CODE if hf.get(k)]
    if custom:
        refuse(f"it declares code of its own ({', '.join(f'{k}={hf[k]!r}' for k in custom)}); Sprout never runs a "
               "folder's code and computes only Qwen3 (remove the entries if the model is a plain Qwen3)")
    _check_architecture(hf, refuse)
    _check_attention(hf, refuse)
    _check_layers(hf, refuse)
    try:
        return SproutConfig(
            vocab_size=hf["vocab_size"], context=hf.get("max_position_embeddings", 32768),
            n_layer=hf["num_hidden_layers"], n_head=hf["num_attention_heads"], d_model=hf["hidden_size"],
            d_ff=hf["intermediate_size"], rope_base=_rope_theta(hf, refuse),
        )
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def _check_architecture(hf: dict[str, Any], refuse) -> None:
    if hf.get("model_type") != "qwen3":
        refuse(f"model_type is {hf.get('model_type')!r}; only 'qwen3' (Qwen3ForCausalLM) is supported")
    archs = hf.get("architectures") or ["Qwen3ForCausalLM"]
    if archs != ["Qwen3ForCausalLM"]:
        refuse(f"architectures is {archs}; expected Qwen3ForCausalLM")
    need = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
    missing = [k for k in need if k not in hf]
    if missing:
        refuse(f"missing keys {missing}")
    if not hf.get("tie_word_embeddings", False):  # Qwen3Config's default is untied
        refuse("tie_word_embeddings is not true; Sprout's output layer is the embedding matrix")
    if hf.get("quantization_config"):
        refuse("the weights are quantized; Sprout needs floating-point weights")


def _check_attention(hf: dict[str, Any], refuse) -> None:
    d_model, n_head = hf["hidden_size"], hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or n_head
    if kv != n_head:
        refuse(f"grouped KV heads (num_key_value_heads={kv} != num_attention_heads={n_head}); "
               "Sprout has one key/value head per query head")
    head_dim = hf.get("head_dim", 128)  # Qwen3Config's default when the key is absent
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (head_dim, n_head, d_model)):
        refuse(f"head_dim={head_dim!r}, num_attention_heads={n_head!r}, hidden_size={d_model!r}: expected integers")
    if head_dim * n_head != d_model:
        refuse(f"head_dim={head_dim} but hidden_size / num_attention_heads = {d_model} / {n_head}; "
               "Sprout's heads split the residual stream exactly")
    if hf.get("attention_bias", False):
        refuse("attention_bias=true; Sprout has no biases")
    types = hf.get("layer_types") or ["full_attention"]
    if not all(isinstance(t, str) for t in types):
        refuse(f"layer_types is {types!r:.80}; expected a list of strings such as 'full_attention'")
    types = set(types)
    if hf.get("use_sliding_window", False) or types != {"full_attention"}:
        refuse(f"sliding-window attention (use_sliding_window={hf.get('use_sliding_window')}, "
               f"layer_types {sorted(types)}); Sprout attends to the whole context")


def _check_layers(hf: dict[str, Any], refuse) -> None:
    eps = hf.get("rms_norm_eps", EPS)
    if eps != EPS:
        refuse(f"rms_norm_eps={eps}; Sprout's RMSNorm uses {EPS}")
    if hf.get("hidden_act", "silu") != "silu":
        refuse(f"hidden_act={hf['hidden_act']!r}; Sprout's MLP is SwiGLU (silu)")


def _rope_theta(hf: dict[str, Any], refuse) -> float:
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    for p in (params, scaling):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind != "default":
            refuse(f"RoPE scaling of type {kind!r}; Sprout uses plain RoPE")
        extra = sorted(set(p) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
        if extra:
            refuse(f"RoPE parameters {extra}; Sprout uses plain RoPE")
        if p.get("partial_rotary_factor", 1.0) != 1.0:
            refuse(f"partial_rotary_factor={p['partial_rotary_factor']}; Sprout rotates every dimension")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        refuse(f"rope_theta={theta!r}; expected a number")
    return float(theta)


def from_qwen3(tensors: dict[str, torch.Tensor], cfg: SproutConfig, source: str = "weights") -> dict[str, torch.Tensor]:
    """Qwen3 tensors -> Sprout's state dict, after checking every key and shape (one error lists all)."""
    present = layers_present(cfg, tensors, rename=lambda k: "model.layers." + k.removeprefix("blocks."))
    if present < cfg.n_layer:  # before listing n_layer layers of expected keys (the config may ask for 10^6)
        raise ValueError(f"{source}: config field num_hidden_layers={cfg.n_layer}, but the weights hold {present} "
                         "layer(s) (model.layers.*)")
    C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    expected = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(cfg.n_layer):
        p = f"model.layers.{l}."
        expected.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                         p + "self_attn.o_proj.weight": (C, C), p + "self_attn.q_norm.weight": (cfg.d_head,),
                         p + "self_attn.k_norm.weight": (cfg.d_head,), p + "mlp.gate_proj.weight": (F, C),
                         p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)})
        expected.update({p + name: (C, C) for name in QKV})
    tensors = dict(tensors)
    lm_head = tensors.pop("lm_head.weight", None)
    problems = [f"{k}: missing (expected {s})" for k, s in expected.items() if k not in tensors]
    problems += [f"{k}: expected {s}, found {tuple(tensors[k].shape)}" for k, s in expected.items()
                 if k in tensors and tuple(tensors[k].shape) != s]
    for k, t in tensors.items():
        if k not in expected:
            why = "a bias, and Sprout has none" if k.endswith(".bias") else "not part of a Qwen3 Sprout"
            problems.append(f"{k}: unexpected ({why}), shape {tuple(t.shape)}")
        elif not t.is_floating_point():
            problems.append(f"{k}: dtype {t.dtype} is not floating point")
    embed = tensors.get("model.embed_tokens.weight")
    if not problems and lm_head is not None and embed is not None and not torch.equal(lm_head, embed):
        problems.append("lm_head.weight: differs from model.embed_tokens.weight, but Sprout ties them")
    if problems:
        raise ValueError(f"{source}: the weights do not fit a Sprout with config {cfg} ({len(problems)} "
                         "problem(s)):\n  " + "\n  ".join(problems[:60]))
    assert embed is not None  # a missing key is one of the problems
    sd = {"embed.weight": embed, "norm.weight": tensors["model.norm.weight"]}
    for l in range(cfg.n_layer):
        ours, theirs = block(l), f"model.layers.{l}."
        for name, hf_name in LAYER_KEYS.items():
            sd[ours + name] = tensors[theirs + hf_name]
        sd[ours + "attn.qkv.weight"] = torch.cat([tensors[theirs + n] for n in QKV], dim=0)
    return sd


def _tokenizer(path: Path):
    if not os.path.lexists(path):
        return None
    path = file_in(path.parent, path.name, "tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for bad JSON
        raise ValueError(f"cannot read the tokenizer {path}: {e}") from e


def load(directory: PathLike) -> Sprout:
    """Read a Qwen3ForCausalLM folder (as `export` writes) into a Sprout, in eval mode: `sprout.files.hf.load(dir)`.

    Args:
        directory: a folder with config.json and model.safetensors (or safetensors shards), and
            optionally tokenizer.json, which becomes `model.tokenizer`.

    Returns:
        The Sprout, on the CPU, in the dtype of the stored weights.

    Raises:
        ValueError: the config describes a model Sprout cannot represent (the message says why), or
            the weights do not fit it (the message lists every offending key).
    """
    directory = Path(directory)
    if not directory.is_dir():
        regular_file(directory, "Hugging Face folder")  # missing: FileNotFoundError; a pipe: named
        raise ValueError(f"{directory} is a file: expected a Hugging Face model folder")
    config_path = directory / "config.json"
    if not os.path.lexists(config_path):
        raise ValueError(f"{directory}: no config.json; is this a Hugging Face model folder?")
    config_path = file_in(directory, "config.json", "config.json")
    cfg = sprout_config(read_json_file(config_path), source=str(config_path))
    sd = from_qwen3(read_safetensors(directory), cfg, source=str(directory))
    tokenizer = _tokenizer(directory / "tokenizer.json")
    model = from_state_dict(sd, cfg, tokenizer, source=str(directory)).eval()
    assert isinstance(model, Sprout)  # what a SproutConfig builds
    return model


import_ = load  # the first name of `load`, kept so code written for it runs


# --- command line ---------------------------------------------------------------------------------

def export_main(argv: Optional[Sequence[str]] = None) -> int:
    """`sprout export-hf CHECKPOINT OUT_DIR`: write a checkpoint as a Qwen3ForCausalLM folder."""
    ap = argparse.ArgumentParser(prog="sprout export-hf", description=export_main.__doc__)
    ap.add_argument("checkpoint", help="a Sprout checkpoint (anything sprout.load reads)")
    ap.add_argument("out_dir", help="the Hugging Face folder to write")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    args = ap.parse_args(argv)
    try:
        model = load_checkpoint(args.checkpoint)
    except (OSError, ValueError) as e:
        raise SystemExit(f"sprout export-hf: {e}") from None
    if not isinstance(model, Sprout):
        raise SystemExit(f"sprout export-hf: {args.checkpoint} is a {type(model).__name__}, not a Sprout; "
                         "only Sprout models map onto Qwen3")
    try:
        print(f"wrote {export(model, args.out_dir, overwrite=args.overwrite)}")
    except OSError as e:  # a folder of the user's in the way: one line, no traceback
        raise SystemExit(f"sprout export-hf: {e}") from None
    return 0


def import_main(argv: Optional[Sequence[str]] = None) -> int:
    """`sprout import-hf DIR OUT_CHECKPOINT`: read a Qwen3ForCausalLM folder into a Sprout checkpoint."""
    ap = argparse.ArgumentParser(prog="sprout import-hf", description=import_main.__doc__)
    ap.add_argument("hf_dir", help="a Hugging Face Qwen3ForCausalLM folder")
    ap.add_argument("out_checkpoint", help="the Sprout checkpoint folder to write")
    args = ap.parse_args(argv)
    try:
        print(f"wrote {save(load(args.hf_dir), args.out_checkpoint)}")
    except (OSError, ValueError) as e:  # one line naming the folder, no traceback
        raise SystemExit(f"sprout import-hf: {e}") from None
    return 0
