"""Sprouts with circuits planted by hand: the ground truth every discovery method is scored against.

Real `sprout.model.Sprout`s (RMSNorm, RoPE, QK-norm, SwiGLU, tied embeddings): 2 layers of 3 heads of
d_head 64, d_model 192, vocabulary 16. The residual stream is cut into slots:
  dims 0..15    the token, one-hot (tied embedding, so also what the logits read)
  dim 16        a constant `const` at every position (what positional queries and keys read, and the
                reference magnitude the final norm divides by)
  dims 32..47   "the token before me", written by the previous-token head L0H0
  dims 64..79   the same, written by the distractor L0H1 into a slot no reader uses
  dims 96..111  f(token), written by MLP0 (kind "mlp" only)
  dims 128..143 what the induction head copied, f(next token) (kind "mlp" only)

Previous-token heads (L0H0, L0H1, and L1H2 when it is not the backup): query and key read the constant;
the key is the query turned back one RoPE step on the fast pairs 0..7, so scores peak at key = query - 1
(RoPE's relative-position structure does the work). The induction head L1H0: query = the token (on the
slow pairs 16..31, which RoPE barely turns), key = L0H0's slot (K-composition), value = the token; it
writes `out_scale` x the copied token into the token dims. L1H1 attends exactly like L1H0 and writes
nothing. QK-norm bounds every score by its gains, so the gains (`prev_gain`, `induction_gain`) set how
sharp the patterns are: 3 makes the induction scores 72 apart, a saturated softmax.

Kinds:
  "induction": the circuit above.
  "backup": L1H2 is a second induction head writing `backup_scale` x the token; with the primary in
      place it adds little (the final norm and a confident softmax absorb it), with the primary ablated
      it restores much of the task.
  "mlp": the task runs through two MLPs: MLP0 looks up f(token) (a permutation, one SwiGLU unit per
      token) into its slot, L1H0's value reads that slot and writes into the copy slot, and MLP1 looks
      up f^-1 of it into the token dims: the same induction answer, through two layers of MLP.

The task (`induction_pair`): clean [A A] (a random order of distinct tokens, repeated), corrupted [B C]
(two unrelated random orders: no repeat to copy); the metric (`induction_metric`) is the mean log
probability of the right next token over the second half. `truth(kind, ablation)` is the circuit by
construction; `tests/interp/discovery/test_planted.py` checks it against exact patching of every edge.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from sprout import Sprout, SproutConfig
from sprout.layers import RMSNorm, rope_rows, rope_tables

CFG = SproutConfig(vocab_size=16, context=64, n_layer=2, n_head=3, d_model=192, d_ff=32)
D_HEAD, VOCAB = 64, 16
CONST, PREV, DECOY, LUT, COPY = 16, 32, 64, 96, 128
KINDS = ("induction", "backup", "mlp")


def lookup() -> torch.Tensor:
    """f, the permutation MLP0 applies in kind "mlp": f(t) = (5 t + 3) mod 16."""
    return (5 * torch.arange(VOCAB) + 3) % VOCAB


def _positional_qk(cfg: SproutConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A query u on the fast pairs 0..7 and the key R_1 u: scores peak where key = query - 1."""
    u = torch.zeros(D_HEAD)
    half = D_HEAD // 2
    u[:8] = 1.0
    cos, sin = rope_tables(D_HEAD, 2, cfg.rope_base)
    cos_rows, sin_rows = rope_rows(cos, sin)
    return u, u * cos_rows[1, 0] + u.roll(half, dims=-1) * sin_rows[1, 0]


def _block(model: Sprout, layer: int) -> Any:
    """Block `layer` of the model (typed loosely: its modules are read and written by name)."""
    return model.blocks[layer]


def _rows(h: int) -> slice:
    return slice(h * D_HEAD, (h + 1) * D_HEAD)


def _eye() -> torch.Tensor:
    return torch.eye(VOCAB)


def _previous_token(model: Sprout, layer: int, h: int, slot: int | None) -> None:
    """Head `h` of `layer` attends to the previous position; with a slot, it writes that token there."""
    attn, d = _block(model, layer).attn, CFG.d_model
    u, k = _positional_qk(CFG)
    attn.qkv.weight[_rows(h), CONST] = u
    attn.qkv.weight[d:][_rows(h), CONST] = k
    if slot is not None:
        attn.qkv.weight[2 * d:][_rows(h)][:VOCAB, :VOCAB] = _eye()
        attn.proj.weight[slot:slot + VOCAB, h * D_HEAD:h * D_HEAD + VOCAB] = _eye()


def _induction(model: Sprout, h: int, value_slot: int, out_slot: int, scale: float) -> None:
    """Head `h` of layer 1: query = token, key = L0H0's slot, value = `value_slot`, writes scale x it into `out_slot`."""
    attn, d = _block(model, 1).attn, CFG.d_model
    attn.qkv.weight[_rows(h)][16:32, :VOCAB] = _eye()
    attn.qkv.weight[d:][_rows(h)][16:32, PREV:PREV + VOCAB] = _eye()
    attn.qkv.weight[2 * d:][_rows(h)][:VOCAB, value_slot:value_slot + VOCAB] = _eye()
    attn.proj.weight[out_slot:out_slot + VOCAB, h * D_HEAD:h * D_HEAD + VOCAB] = scale * _eye()


def _lookup_mlp(model: Sprout, layer: int, read: int, write: int, table: torch.Tensor, scale: float, sharp: float) -> None:
    """MLP `layer` as a lookup: unit t fires silu(sharp x_t) x_t on the one-hot slot at `read` and
    writes scale e_table[t] at `write`; a slot of zeros gives exactly zero."""
    ffn = _block(model, layer).ffn
    for t in range(VOCAB):
        ffn.w1.weight[t, read + t] = sharp
        ffn.w3.weight[t, read + t] = 1.0
        ffn.w2.weight[write + int(table[t]), t] = scale


@torch.no_grad()
def planted_model(kind: str = "induction", *, const: float = 10.0, prev_gain: float = 3.0, induction_gain: float = 3.0,
                  out_scale: float = 30.0, backup_scale: float = 20.0, final_gain: float = 0.5,
                  dtype: torch.dtype = torch.float32) -> Sprout:
    """A Sprout with a planted circuit of `kind` ("induction", "backup", "mlp"; see the module doc).

    Args:
        kind: which circuit.
        const: the constant dim's value in every embedding row.
        prev_gain, induction_gain: the QK-norm gains of the previous-token and induction heads.
        out_scale: what the induction head (kind "mlp": MLP1) writes per unit of the copied token.
        backup_scale: the backup induction head's (kind "backup").
        final_gain: the final norm's gain (a temperature on the logits).
        dtype: of the weights.

    Returns:
        the model, in eval mode.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    model = Sprout(CFG).eval()
    for p in model.parameters():
        p.zero_()
    model.embed.weight[:, :VOCAB] = _eye()
    model.embed.weight[:, CONST] = const
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
    model.norm.weight.fill_(final_gain)
    for layer, gain in ((0, prev_gain), (1, induction_gain)):
        _block(model, layer).attn.q_norm.weight.fill_(gain)
        _block(model, layer).attn.k_norm.weight.fill_(gain)
    _previous_token(model, 0, 0, PREV)
    _previous_token(model, 0, 1, DECOY)
    if kind == "mlp":
        f = lookup()
        _lookup_mlp(model, 0, 0, LUT, f, 1.0, 4.0)
        _induction(model, 0, LUT, COPY, 1.0)
        _lookup_mlp(model, 1, COPY, 0, torch.argsort(f), out_scale, 4.0)
    else:
        _induction(model, 0, 0, 0, out_scale)
    _induction(model, 1, 0, 0, 0.0)  # the decoy: attends like L1H0, writes nothing
    if kind == "backup":
        _induction(model, 2, 0, 0, backup_scale)
    else:
        _previous_token(model, 1, 2, None)
    return model.to(dtype)


def induction_pair(n_seqs: int = 8, half_len: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(clean [A A], corrupted [B C]), each [n_seqs, 2 half_len]: no token repeats inside a half (ids 0..15),
    and no corrupted token equals the clean answer at its position (so the embedding's direct path to the
    logits cannot help or hurt the answer by chance)."""
    if not 1 < half_len <= VOCAB:
        raise ValueError(f"half_len must be in 2..{VOCAB} (distinct tokens per half), got {half_len}")
    g = torch.Generator().manual_seed(seed)

    def order() -> torch.Tensor:
        return torch.randperm(VOCAB, generator=g)[:half_len]
    clean, corrupted = [], []
    for _ in range(n_seqs):
        first = order()
        row = torch.cat([first, first])
        other = torch.cat([order(), order()])
        while (other[half_len:-1] == row[half_len + 1:]).any():
            other = torch.cat([other[:half_len], order()])
        clean.append(row)
        corrupted.append(other)
    return torch.stack(clean), torch.stack(corrupted)


def induction_metric(clean: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """logits [batch, pos, vocab] -> the mean log probability of clean's next token over the second half."""
    half = clean.size(1) // 2
    target = clean[:, half + 1:]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        logp = logits[:, half:-1].log_softmax(-1)
        return logp.gather(-1, target[..., None].to(logp.device)).mean()
    return metric


_CORE = {("embed", "L0H0", "v"), ("L0H0", "L1H0", "k"), ("embed", "L1H0", "q")}
_TRUTH = {
    "induction": _CORE | {("embed", "L1H0", "v"), ("L1H0", "logits", "logits")},
    "backup": _CORE | {("embed", "L1H0", "v"), ("L1H0", "logits", "logits"),
                       ("L0H0", "L1H2", "k"), ("embed", "L1H2", "q"), ("embed", "L1H2", "v"), ("L1H2", "logits", "logits")},
    "mlp": _CORE | {("embed", "MLP0", "mlp_in"), ("MLP0", "L1H0", "v"), ("L1H0", "MLP1", "mlp_in"), ("MLP1", "logits", "logits")},
}


def truth(kind: str = "induction", ablation: str = "resample") -> set[tuple[str, str, str]]:
    """The planted circuit of `kind` under `ablation`, as (sender, receiver, via) edges.

    "resample" and "mean": the edges that carry the token information (a counterfactual keeps the
    constant, so the positional queries and keys of the previous-token heads are untouched).
    "zero": also the edges that carry the constant where a reader needs it: the embedding into
    L0H0's query and key (its position signal) and into the logits (the final norm's reference)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if ablation not in ("resample", "mean", "zero"):
        raise ValueError(f"ablation must be 'resample', 'mean' or 'zero', got {ablation!r}")
    edges = set(_TRUTH[kind])
    if ablation == "zero":
        edges |= {("embed", "L0H0", "q"), ("embed", "L0H0", "k"), ("embed", "logits", "logits")}
    return edges
