"""A Sprout with a planted induction circuit, weights set by hand.

Residual stream (d_model 192, three heads of d_head 64 per layer, vocab 16):
  dims 0..15   the token, one-hot (tied embedding, so also what the logits read)
  dim 16       a constant, the same at every position (what positional queries and keys read)
  dims 32..47  "the token before me", written by the previous-token head L0H0
  dims 64..79  the same, written by the decoy L0H1 into a subspace nothing reads

L0H0 and L0H1 attend to the previous position (query and key read the constant; the key is the query
turned back one RoPE step, on the fast-rotating pairs 0..7). L1H0 is the induction head: its query reads
the token (into the slow pairs 16..31, where RoPE barely turns over 64 positions), its key reads L0H0's
slot, its value the token, and it writes the attended token into the token dims, strongly. Decoys that
attend like real heads but feed nothing: L0H1 (previous-token, writes an unread slot), L1H1 (attends
exactly like L1H0, writes nothing), L1H2 (previous-token, writes nothing). L0H2 and the MLPs are zero.
The one planted edge: L0H0 -> L1H0 through the key.
"""
import torch

from sprout import Sprout, SproutConfig
from sprout.layers import rope_rows, rope_tables

CFG = SproutConfig(vocab_size=16, context=64, n_layer=2, n_head=3, d_model=192, d_ff=32)
D_HEAD, CONST, PREV, DECOY = 64, 16, 32, 64
PLANTED = {("L0H0", "L1H0", "k")}


def _positional_qk(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """A query u on the fast pairs 0..7 and the key R_1 u: scores peak where key = query - 1."""
    u = torch.zeros(D_HEAD)
    half = D_HEAD // 2
    u[:8], u[half:half + 8] = 1.0, 0.0
    cos, sin = rope_tables(D_HEAD, 2, cfg.rope_base)
    cos_rows, sin_rows = rope_rows(cos, sin)
    k = u * cos_rows[1, 0] + u.roll(half, dims=-1) * sin_rows[1, 0]
    return u, k


def _head_rows(h: int) -> slice:
    return slice(h * D_HEAD, (h + 1) * D_HEAD)


@torch.no_grad()
def planted_model(qk_gain: float = 3.0, out_scale: float = 30.0) -> Sprout:
    model = Sprout(CFG).eval()
    for p in model.parameters():
        p.zero_()
    d = CFG.d_model
    model.embed.weight[:, :16] = torch.eye(16)
    model.embed.weight[:, CONST] = 1.0
    for module in model.modules():
        if module.__class__.__name__ == "RMSNorm":
            module.weight.fill_(1.0)
    u, k = _positional_qk(CFG)
    for block in model.blocks:
        block.attn.q_norm.weight.fill_(qk_gain)
        block.attn.k_norm.weight.fill_(qk_gain)
    qkv0, proj0 = model.blocks[0].attn.qkv.weight, model.blocks[0].attn.proj.weight
    for h, slot in ((0, PREV), (1, DECOY)):  # previous-token heads: the real one and the decoy
        qkv0[_head_rows(h), CONST] = u
        qkv0[d:][_head_rows(h), CONST] = k
        qkv0[2 * d:][_head_rows(h)][:16, :16] = torch.eye(16)
        proj0[slot:slot + 16, h * D_HEAD:h * D_HEAD + 16] = torch.eye(16)
    qkv1, proj1 = model.blocks[1].attn.qkv.weight, model.blocks[1].attn.proj.weight
    for h in (0, 1):  # the induction head and its decoy: query = token, key = L0H0's slot
        qkv1[_head_rows(h)][16:32, :16] = torch.eye(16)
        qkv1[d:][_head_rows(h)][16:32, PREV:PREV + 16] = torch.eye(16)
        qkv1[2 * d:][_head_rows(h)][:16, :16] = torch.eye(16)
    proj1[:16, :16] = out_scale * torch.eye(16)  # only L1H0 writes
    qkv1[_head_rows(2), CONST] = u  # L1H2: previous-token decoy
    qkv1[d:][_head_rows(2), CONST] = k
    return model


def permuted_pair(n_seqs: int = 8, half_len: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean [A A] and corrupted [B B] with no token repeated inside a half (ids 1..15)."""
    g = torch.Generator().manual_seed(seed)

    def halves():
        first = torch.stack([torch.randperm(15, generator=g)[:half_len] + 1 for _ in range(n_seqs)])
        return torch.cat([first, first], dim=1)
    return halves(), halves()
