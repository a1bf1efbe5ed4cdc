"""A Sprout with a planted induction circuit, weights set by hand (built by `interp.discovery.planted`).

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

from interp.discovery import planted

CFG = planted.CFG
D_HEAD, CONST, PREV, DECOY = planted.D_HEAD, planted.CONST, planted.PREV, planted.DECOY
PLANTED = {("L0H0", "L1H0", "k")}


def planted_model(qk_gain: float = 3.0, out_scale: float = 30.0):
    """`interp.planted`'s induction circuit as these tests first built it: constant 1, final gain 1."""
    return planted.planted_model("induction", const=1.0, prev_gain=qk_gain, induction_gain=qk_gain,
                                 out_scale=out_scale, final_gain=1.0)


def permuted_pair(n_seqs: int = 8, half_len: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean [A A] and corrupted [B B] with no token repeated inside a half (ids 1..15)."""
    g = torch.Generator().manual_seed(seed)

    def halves():
        first = torch.stack([torch.randperm(15, generator=g)[:half_len] + 1 for _ in range(n_seqs)])
        return torch.cat([first, first], dim=1)
    return halves(), halves()
