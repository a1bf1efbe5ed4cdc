"""Sprout: the course's model.py with TransformerLens hook points.

A decoder-only transformer: pre-norm RMSNorm, rotary position embeddings on split-half pairs, causal
multi-head attention with per-head QK-RMSNorm, a SwiGLU feed-forward layer, output layer tied to the
embedding, no biases. Parameters and state-dict keys are exactly model.py's, so its checkpoints load
with strict=True and give the same logits.

Hook points carry TransformerLens' canonical names (`blocks.0.ln1.hook_scale`, `blocks.0.mlp.hook_post`,
`ln_final.hook_normalized`, `unembed.hook_out`). model.py calls its modules `norm1`, `ffn`, `norm` and
`head`, and a HookPoint's name is its module path, so the hook points of a norm, the MLP and the
unembedding live in small weightless modules (`ln1`, `mlp`, `ln_final`, `unembed`) that sit beside the
weighted ones and are handed to them in forward. The state dict keeps model.py's keys; the hooks keep
TransformerLens' names; nothing is registered twice. The small layers (norms, RoPE, SwiGLU, the hook
modules) are in `sprout.layers`; here are the attention, the block and the models built from them:
`Sprout` (TransformerLens' contract) and `GPT` (the course's), over the same modules.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float
from tokenizers import Tokenizer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.hook_points import HookPoint
from transformers import PreTrainedTokenizerFast

from .config import SproutConfig, SproutTransformerLensConfig
from .layers import FeedForward, FinalNormHooks, MLPHooks, NormHooks, RMSNorm, UnembedHooks, rope_rows, rope_tables, rotate
from .tl import text
from .tl.forward import blocks_in_range, course_loss
from .tl.generation import sample
from .tl.hook_flags import editable, per_head_inputs
from .tl.hooked import HookedLM, follow_weights, hooked
from .tl.kv_cache import padding_masks
from .tl.pattern_attention import hooked_attention
from .tl.surface import ReadOnly
from .tl.weights import Embed, Ref, sprout_b_O, sprout_b_qkv, sprout_W_K, sprout_W_O, sprout_W_Q, sprout_W_V

AnyTokenizer = Union[Tokenizer, PreTrainedTokenizerFast]  # what `model.tokenizer` takes (it holds the latter)


class Attention(nn.Module):
    """Causal multi-head self-attention with per-head QK-RMSNorm and RoPE.

    In TransformerLens' layout (`sprout.tl.weights`), computed on each read from the fused `qkv` and
    `proj`: `W_Q`, `W_K`, `W_V` [head, d_model, d_head] (ln1's gain folded in), `W_O` [head, d_head,
    d_model], and the zero biases. The QK-norm gains are not in `W_Q`/`W_K`: they act after QK-norm's
    per-vector rescaling (see docs/guide/model.md, QK circuits on Sprout)."""

    W_Q = ReadOnly(sprout_W_Q, "[head, d_model, d_head]: the query rows of `qkv`, ln1's gain folded in (not QK-norm's).")
    W_K = ReadOnly(sprout_W_K, "[head, d_model, d_head]: the key rows of `qkv`, ln1's gain folded in (not QK-norm's).")
    W_V = ReadOnly(sprout_W_V, "[head, d_model, d_head]: the value rows of `qkv`, ln1's gain folded in.")
    W_O = ReadOnly(sprout_W_O, "[head, d_head, d_model]: `proj`, split by head.")
    b_Q = ReadOnly(sprout_b_qkv, "[head, d_head]: zeros (Sprout has no biases).")
    b_K = ReadOnly(sprout_b_qkv, "[head, d_head]: zeros (Sprout has no biases).")
    b_V = ReadOnly(sprout_b_qkv, "[head, d_head]: zeros (Sprout has no biases).")
    b_O = ReadOnly(sprout_b_O, "[d_model]: zeros (Sprout has no biases).")

    def __init__(self, cfg: SproutConfig, norm: Optional[RMSNorm] = None) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.d_head = cfg.d_head
        self.norm: Ref[Optional[RMSNorm]] = Ref(norm)  # ln1's RMSNorm, whose gain W_Q/W_K/W_V fold in
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(self.d_head)
        self.k_norm = RMSNorm(self.d_head)
        self.rope_base = cfg.rope_base  # for a direct call, which brings no RoPE tables
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_q_normed = HookPoint()  # after QK-norm
        self.hook_k_normed = HookPoint()
        self.hook_rot_q = HookPoint()  # after RoPE
        self.hook_rot_k = HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos], masked with -inf
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos], rows sum to 1
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]: each head's write to the stream

    def attend(self, x: Union[Float[torch.Tensor, "batch pos d_model"], tuple[Float[torch.Tensor, "batch pos head d_model"], ...]],
               cos: torch.Tensor, sin: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
               kv: Optional[TransformerLensKeyValueCacheEntry] = None) -> torch.Tensor:
        """The block's call. x [batch, pos, d_model], or with split inputs a tuple of each head's own (normalised) copy
        for Q, K and V, each [batch, pos, head, d_model]; cos/sin the whole-row tables of `rope_rows`,
        [pos, 1, d_head] (or [batch, pos, 1, d_head] per row); attn_mask None (causal) or bool
        [batch, 1, query, key], True = may attend. `kv`, a TransformerLens key-value cache entry, holds
        the earlier positions' keys (after QK-norm and RoPE) and values; the new ones are appended."""
        q, k, v = self.project_per_head(*x) if isinstance(x, tuple) else self.project(x)
        # A hook may edit q, k, v in place: with autograd on, they must not be views of one fused output.
        q = self.hook_q(editable(q, self.hook_q))
        k = self.hook_k(editable(k, self.hook_k))
        v = self.hook_v(editable(v, self.hook_v))
        q = self.hook_q_normed(self.q_norm(q))
        k = self.hook_k_normed(self.k_norm(k))
        q = self.hook_rot_q(rotate(q, cos, sin))
        k = self.hook_rot_k(rotate(k, cos, sin))
        if kv is not None:
            k, v = kv.append(k, v)  # [batch, past + pos, head, d_head]; attn_mask then covers every key
        B, T = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, head, T, d_head)
        if hooked(self.hook_attn_scores, self.hook_pattern):
            # Materialise scores and pattern only when someone reads or edits them; unedited, z is still
            # the fused kernel's (sprout/tl/pattern_attention.py).
            # In place: scores is fresh, and a copy of [batch, head, pos, pos] costs as much as the softmax.
            scores = (q @ k.transpose(-2, -1)).div_(math.sqrt(self.d_head))
            hidden = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1) if attn_mask is None else ~attn_mask
            z = hooked_attention(q, k, v, scores.masked_fill_(hidden, float("-inf")), attn_mask,
                                 self.hook_attn_scores, self.hook_pattern, editable)
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)
        z = self.hook_z(editable(z.transpose(1, 2), self.hook_z))  # (B, T, head, d_head); attention keeps its output
        C = self.proj.weight.size(0)
        if hooked(self.hook_result):
            W_O = self.proj.weight.view(C, self.n_head, self.d_head)
            result = self.hook_result(torch.einsum("bphd,mhd->bphm", z, W_O))
            return result.sum(dim=2)
        return self.proj(z.reshape(B, T, C))

    def forward(self, query_input: torch.Tensor, key_input: Optional[torch.Tensor] = None,
                value_input: Optional[torch.Tensor] = None, past_kv_cache_entry: Optional[TransformerLensKeyValueCacheEntry] = None,
                additive_attention_mask: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_bias: Optional[Float[torch.Tensor, "1 head pos key_pos"]] = None) -> torch.Tensor:
        """TransformerLens' Attention call: the attention's output [batch, pos, d_model] from ln1's output.

        query_input, key_input, value_input: [batch, pos, d_model] (key and value default to the query's),
        or each head's own [batch, pos, head, d_model]; positions 0..pos-1 (RoPE), causal;
        attention_mask [batch, pos] of 1 (token) and 0 (padding), or TransformerLens' additive mask
        [batch, 1, 1, pos] (0 or -inf). A KV cache goes through the model's forward, not this call.
        """
        if past_kv_cache_entry is not None or position_bias is not None:
            what = "past_kv_cache_entry" if past_kv_cache_entry is not None else "position_bias"
            raise ValueError(f"{what} is not taken by a direct call of Sprout's attention (RoPE, no ALiBi); "
                             "run the model's forward for cached keys and values")
        x: torch.Tensor | tuple[torch.Tensor, ...] = tuple(
            query_input if t is None else t for t in (query_input, key_input, value_input))
        if x[0].dim() == 3 and all(t is x[0] for t in x):
            x = x[0]
        elif x[0].dim() == 3:
            x = tuple(t.unsqueeze(2).expand(-1, -1, self.n_head, -1) for t in x)
        B, T = query_input.shape[:2]
        positions = mask = None
        if additive_attention_mask is not None:
            attention_mask = (additive_attention_mask.reshape(B, -1)[:, -T:] == 0).long()
        if attention_mask is not None:
            positions, mask = padding_masks(attention_mask.to(query_input.device))
        cos, sin = rope_tables(self.d_head, T, self.rope_base)
        cos, sin = cos.to(query_input.device), sin.to(query_input.device)
        rows = rope_rows(cos, sin) if positions is None else rope_rows(cos[positions], sin[positions])
        return self.attend(x, *rows, mask)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [batch, pos, d_model] -> q, k, v [batch, pos, head, d_head], in one fused matmul."""
        B, T, C = x.shape
        return tuple(t.view(B, T, self.n_head, self.d_head) for t in self.qkv(x).split(C, dim=-1))

    def project_per_head(self, xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor
                         ) -> tuple[Float[torch.Tensor, "batch pos head d_head"], ...]:
        """Each head's q, k, v [batch, pos, head, d_head] from its own input [batch, pos, head, d_model]."""
        W = self.qkv.weight.view(3, self.n_head, self.d_head, -1)
        return tuple(torch.einsum("bphm,hdm->bphd", x, W[i]) for i, x in enumerate((xq, xk, xv)))


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(norm1(x)), then x + ffn(norm2(x))."""

    hook_out_is_single_residual_stream = True  # TransformerLens' logit_lens asks

    def __init__(self, cfg: SproutConfig, flags: SproutTransformerLensConfig) -> None:
        super().__init__()
        # Registration order matches model.py's, so the same seed gives the same initial weights.
        self.norm1 = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, norm=self.norm1)
        self.norm2 = RMSNorm(cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.ln1, self.ln2, self.mlp = NormHooks(self.norm1), NormHooks(self.norm2), MLPHooks(self.norm2, self.ffn)
        self.flags = flags  # the model's cfg: TransformerLens' hook flags are read from it (sprout/tl/hook_flags.py)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()
        # Fire only with TransformerLens' flags on (sprout/tl/hook_flags.py):
        self.hook_q_input = HookPoint()  # [batch, pos, head, d_model]: each head's copy of resid_pre, before ln1
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_attn_in = HookPoint()  # [batch, pos, head, d_model]: one copy per head for Q, K and V
        self.hook_mlp_in = HookPoint()  # [batch, pos, d_model]: the MLP's input before ln2, a copy

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None, kv: Optional[TransformerLensKeyValueCacheEntry] = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        flags = self.flags
        if flags.use_split_qkv_input or flags.use_attn_in:
            attn_in = per_head_inputs(self, x, self.attn.n_head, flags.use_attn_in, lambda c: self.norm1(c))
            if hooked(self.ln1.hook_scale, self.ln1.hook_normalized):
                self.norm1(x, self.ln1)  # ln1's hooks still see the shared stream; the heads read their copies
        else:
            attn_in = self.norm1(x, self.ln1)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn.attend(attn_in, cos, sin, attn_mask, kv)))
        mlp_in = self.hook_mlp_in(x.clone()) if flags.use_hook_mlp_in else x
        x = self.hook_resid_post(x + self.hook_mlp_out(self.ffn(self.norm2(mlp_in, self.ln2), self.mlp)))
        return x


class SproutTransformer(nn.Module):
    """Sprout's modules and the pass through them, under neither calling convention: the parent of
    `Sprout` (TransformerLens' contract) and `GPT` (the course's). Both hold these modules under these
    names, so both state dicts are model.py's and either loads the other's with strict=True.

    `share=other` builds the model over `other`'s modules instead of new ones: the same parameters,
    buffers and hook points (not copies), so training one trains the other (`GPT.from_sprout`,
    `Sprout.from_gpt`). `cfg` is TransformerLens' view of `config`, built once and shared with `share`;
    its `device` and `dtype` follow the weights when the model is moved or cast (`hooked.follow_weights`).
    """

    config: SproutConfig
    cos: torch.Tensor  # buffers [context, d_head] (rope_tables)
    sin: torch.Tensor

    def __init__(self, cfg: SproutConfig, *, share: Optional["SproutTransformer"] = None) -> None:
        super().__init__()
        if share is not None:
            if share.config != cfg:
                raise ValueError(f"share= a model of config {share.config}, not of {cfg}: the modules are its")
            self._adopt(share)
            return
        self.config = cfg
        self.cfg: SproutTransformerLensConfig = cfg.transformer_lens_config()
        self.embed = Embed(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(Block(cfg, self.cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model)
        self.ln_final = FinalNormHooks(self.norm)  # gainless, as TransformerLens' folded ln_final
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # weight tying
        self.unembed = UnembedHooks(self.norm, self.head)
        cos, sin = rope_tables(cfg.d_head, cfg.context, cfg.rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        # residual projections start small so every block begins close to "do nothing"
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("w2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def _adopt(self, other: "SproutTransformer") -> None:
        self.config, self.cfg = other.config, other.cfg
        for name in ("embed", "hook_embed", "blocks", "norm", "ln_final", "head", "unembed"):
            setattr(self, name, getattr(other, name))
        self.register_buffer("cos", other.cos, persistent=False)
        self.register_buffer("sin", other.sin, persistent=False)

    @staticmethod
    def _init(m: nn.Module):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def run_layers(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                   positions: Optional[torch.Tensor] = None, start_at_layer: Optional[int] = None,
                   stop_at_layer: Optional[int] = None, past_kv_cache: Optional[TransformerLensKeyValueCache] = None) -> torch.Tensor:
        """Token ids [batch, pos] -> logits [batch, pos, vocab].

        With padding, `attn_mask` [batch, 1, pos, pos] and each token's RoPE position [batch, pos] (see
        `kv_cache.padding_masks`). With `past_kv_cache`, the positions come after the cached ones:
        `attn_mask` [batch, 1, pos, past + pos] and `positions` count from the cache's (see
        `kv_cache.cache_masks`), and each block appends its keys and values to its entry.
        With `start_at_layer=S`, x is the residual stream entering block S.
        With `stop_at_layer=L` only blocks 0..L-1 run and the stream they leave [batch, pos, d_model]
        is returned, no `blocks.L.*` hook firing (as TransformerLens): a probe of an early layer does
        not pay for the rest of the model. Both are block indices here (`HookedLM.forward` resolves
        negative ones).
        """
        T = x.size(1)
        if positions is None:
            cos, sin = rope_rows(self.cos[:T], self.sin[:T])  # [pos, 1, d_head], built once for every block
        else:
            cos, sin = rope_rows(self.cos[positions], self.sin[positions])  # [batch, pos, 1, d_head]
        if start_at_layer is None:
            x = self.hook_embed(self.embed(x))
        for i, block in blocks_in_range(self.blocks, start_at_layer, stop_at_layer):
            x = block(x, cos, sin, attn_mask, None if past_kv_cache is None else past_kv_cache[i])
        if stop_at_layer is not None:
            return x
        return self.unembed.from_gained(self.norm(x, self.ln_final))


class Sprout(SproutTransformer, HookedLM):
    """The Sprout transformer under TransformerLens' contract: `model(tokens)` is the logits, a plain
    Tensor [batch, pos, vocab]; `return_type`, `loss_per_token`, `attention_mask`, `start_at_layer`,
    `stop_at_layer` as HookedTransformer (see `HookedLM.forward`). What `sprout.load` returns.

    The course's `logits, loss = model(idx, targets)` is `GPT`'s: `GPT.from_sprout(model)` shares these
    weights."""

    def __init__(self, cfg: SproutConfig, tokenizer: Optional[AnyTokenizer] = None, *,
                 share: Optional[SproutTransformer] = None) -> None:
        super().__init__(cfg, share=share)
        self.tokenizer = tokenizer  # optional; held as a Hugging Face PreTrainedTokenizerFast
        self.setup()

    @classmethod
    def from_gpt(cls, gpt: "GPT", tokenizer: Optional[AnyTokenizer] = None) -> "Sprout":
        """The TransformerLens-contract model over a course model's modules (the same parameters)."""
        return cls(gpt.config, tokenizer, share=gpt)


class GPT(SproutTransformer):
    """The course's model.py contract on Sprout's modules: `logits, loss = model(idx, targets, loss_mask)`,
    and `logits, _ = model(idx)` is `(logits, None)`. The state dict is model.py's (and `Sprout`'s).

    `GPT.from_sprout(model)` is the course's view of a loaded model (`sprout.load`), sharing its
    parameters; `Sprout.from_gpt(gpt)` the other way. The hook points are the same modules as the
    Sprout's, so hooks added through a Sprout fire here too.
    """

    def __init__(self, cfg: SproutConfig, *, share: Optional[SproutTransformer] = None) -> None:
        super().__init__(cfg, share=share)

    @classmethod
    def from_sprout(cls, model: Sprout) -> "GPT":
        """The course's model over a Sprout's modules (the same parameters, not a copy)."""
        return cls(model.config, share=model)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Token ids [batch, pos] -> (logits [batch, pos, vocab], loss or None): model.py's forward. The
        loss is the mean next-token cross-entropy of every position against `targets` [batch, pos],
        over the positions where `loss_mask` [batch, pos] is nonzero."""
        logits = self.run_layers(text.check_tokens(self, idx))
        if targets is None:
            return logits, None
        return logits, course_loss(logits, targets, loss_mask)

    def generate(self, idx: torch.Tensor, max_new: int, temperature: float = 0.8, top_k: Optional[int] = None,
                 top_p: Optional[float] = 0.95, stop: Optional[Union[int, Sequence[int]]] = None) -> torch.Tensor:
        """model.py's sampler: `max_new` tokens after idx [batch, pos], at its defaults (temperature 0.8,
        top-p 0.95); ids in an optional `stop` end a row. Returns ids [batch, pos + new]."""
        return sample(Sprout.from_gpt(self), idx, max_new, temperature, top_k, top_p, stop)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _apply(self, fn, recurse: bool = True):
        return follow_weights(super()._apply(fn, recurse))


Config = SproutConfig  # the course's name
