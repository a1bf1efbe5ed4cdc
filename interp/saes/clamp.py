"""Whether clamping a latent does what its logit effects say, against baselines that could do as well.

Clamp any direction into the residual stream and the tokens it promotes through the unembedding tend to
gain probability: an agreement between a latent's logit effects and its clamped effect proves little
unless the latent's agreement beats what random latents and random directions reach under the same
intervention (issue 38). `clamp_baselines` measures, on the same tokens and positions:

- the latent itself, clamped to `value` at every position, spliced in with its error term (so the run
  differs from the clean model by (value - its activation) times its decoder row alone);
- `n` random other latents of the same dictionary, each clamped to the same value the same way;
- `n` random unit directions scaled to the latent's decoder-row norm, `value` times each added to the
  dictionary's output at every position (a latent of activation 0 clamped to `value`, same error term).

Each one's **agreement** = the mean change of next-token log-probability (nats, mean over positions) of
its own k most promoted tokens minus that of its k most suppressed (its own `W_dec @ W_U` row, or `u @
W_U` for a direction). The latent "does what its logit effects say" only when its agreement beats the
95th percentile of the baselines' (`clamp_verdict`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel
from .splice import _spliced, is_transcoder, latent_name

if TYPE_CHECKING:
    from .sae import SAE

PERCENTILE = 95


def _edits(sae, latent: int, value: float, n: int, seed: int) -> list[tuple[str, int, torch.Tensor]]:
    """(source, index, decoder direction [d_out]) of the latent, n random other latents, n random directions."""
    g = torch.Generator().manual_seed(seed)
    d_sae, W_dec = int(sae.W_dec.shape[0]), sae.W_dec.detach().float().cpu()
    others = [j for j in torch.randperm(d_sae, generator=g).tolist() if j != latent][:n]
    norm = W_dec[latent].norm()
    dirs = torch.randn(n, W_dec.shape[1], generator=g)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True) * norm
    return ([("latent", latent, W_dec[latent])] + [("random_latent", j, W_dec[j]) for j in others]
            + [("random_direction", i, dirs[i]) for i in range(n)])


def _run(model: HookedModel, sae, ids: torch.Tensor, source: str, index: int, direction: torch.Tensor,
         value: float) -> torch.Tensor:
    """Logits [batch, pos, vocab] with one edit: a latent clamped, or value x direction added to the output."""
    if source == "random_direction":
        target = sae.hook_name_out if is_transcoder(sae) else sae.hook_name
        add = (value * direction).to(model.cfg.device)
        return model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: x + add.to(x.dtype))])

    def clamp(acts, hook):
        acts[..., index] = value

    with _spliced(model, [sae], use_error_term=True):
        return model.run_with_hooks(ids, fwd_hooks=[(latent_name(sae), clamp)])


@torch.inference_mode()
def clamp_baselines(model: HookedModel, sae: SAE, latent: int, data: TextOrTokens, value: float, n: int = 20, k: int = 10,
                    seed: int = 0, batch_size: int = 8, seq_len: Optional[int] = None) -> pd.DataFrame:
    """The clamped agreement of a latent beside `n` random latents and `n` random unit directions.

    Args:
        model, sae: a hooked model and an `interp.SAE` / `interp.Transcoder` trained on it.
        latent: the latent checked; value: what it (and every baseline) is clamped to.
        data: text, texts or ids, every position of which is clamped and measured.
        n: random latents and random directions each; k: promoted and suppressed tokens per edit.

    Returns:
        One row per edit: `source` ("latent", "random_latent", "random_direction"), `index` (latent id, or
        the direction's number), `up` / `down` (mean Δ log p of its k most promoted / suppressed tokens),
        `agreement` = up - down.
    """
    if n < 1 or k < 1:
        raise ValueError(f"clamp_baselines: n and k must be >= 1, got n={n}, k={k}")
    edits = _edits(sae, int(latent), float(value), n, seed)
    W_U = model.W_U.detach().float().cpu()
    delta, count = torch.zeros(len(edits), W_U.shape[1], dtype=torch.float64), 0
    for _, ids in batches(token_rows(model, data, seq_len), batch_size, model.cfg.device):
        clean = F.log_softmax(model.run_with_hooks(ids).float(), -1)
        for e, (source, index, direction) in enumerate(edits):
            out = F.log_softmax(_run(model, sae, ids, source, index, direction, float(value)).float(), -1)
            delta[e] += (out - clean).double().sum((0, 1)).cpu()
        count += ids.numel()
    delta /= max(count, 1)
    rows = []
    for e, (source, index, direction) in enumerate(edits):
        effect = direction @ W_U
        up = float(delta[e, effect.topk(k).indices].mean())
        down = float(delta[e, effect.topk(k, largest=False).indices].mean())
        rows.append((source, index, up, down, up - down))
    return pd.DataFrame(rows, columns=["source", "index", "up", "down", "agreement"])


def clamp_verdict(table: pd.DataFrame) -> dict:
    """{agreement, baseline_p95, beats_baselines, baseline_pass_rate} from a `clamp_baselines` table:
    the latent's agreement, the 95th percentile of the baselines', whether it beats it, and the share of
    baselines that would pass the old sign check (promoted up, suppressed down)."""
    own, base = table[table.source == "latent"], table[table.source != "latent"]
    if len(own) != 1 or base.empty:
        raise ValueError("clamp_verdict: the table needs one 'latent' row and baseline rows (clamp_baselines' frame)")
    agreement, p95 = float(own.agreement.iloc[0]), float(np.percentile(base.agreement, PERCENTILE))
    return dict(agreement=agreement, baseline_p95=p95, beats_baselines=agreement > p95,
                baseline_pass_rate=float(((base.up > 0) & (base.down < 0)).mean()))
