"""A thresholded dictionary as a JumpReLU one, for tools that read only JumpReLU or ReLU (circuit-tracer).

BatchTopK and Matryoshka dictionaries fire at inference by one learned threshold: a latent is
pre * (pre > threshold) * (pre > 0), which is JumpReLU's rule with that threshold repeated for every latent
(`kinds.batchtopk` and `kinds.jumprelu` encode alike). `to_jumprelu` writes that dictionary as kind
"jumprelu": the same weights, the threshold per latent, so every output is the same bit for bit; `from_jumprelu`
recovers the BatchTopK dictionary from it, to train it further.
"""
from __future__ import annotations

import copy
from typing import cast

import torch

from .kinds import THRESHOLD_KINDS
from .sae import SAE, Transcoder


def to_jumprelu(sae: SAE) -> SAE:
    """The same dictionary (SAE or Transcoder, its skip kept) as kind "jumprelu" with a per-latent threshold.

    Raises:
        ValueError: the dictionary has no threshold to convert (relu and topk: a TopK's cut differs per token).
    """
    if sae.kind == "jumprelu":
        return sae
    if sae.kind not in THRESHOLD_KINDS or sae.threshold is None:
        raise ValueError(f"to_jumprelu: a {sae.kind!r} dictionary has no inference threshold to convert (kinds with "
                         f"one: {', '.join(THRESHOLD_KINDS)})")
    out = _same_shape(sae, kind="jumprelu")
    state = {k: v for k, v in sae.state_dict().items() if k != "threshold"}
    state["threshold"] = sae.threshold.detach().expand(sae.d_sae).clone()
    out.load_state_dict(state)
    out.model_fingerprint, out.model_config = sae.model_fingerprint, copy.deepcopy(sae.model_config)
    out.info = {**copy.deepcopy(sae.info), "converted_from": sae.kind}
    return out


def _same_shape(sae: SAE, **kind) -> SAE:
    """A new dictionary of `sae`'s class, shape, hooks, dtype and device, of another kind (`kind`, `k`)."""
    common = dict(dtype=sae.W_enc.dtype, device=sae.W_enc.device, **kind)
    if isinstance(sae, Transcoder):
        return Transcoder(sae.d_in, sae.d_sae, sae.d_out, skip=sae.skip, layer=sae.layer, hook_name=sae.hook_name,
                          hook_name_out=sae.hook_name_out, **common)
    return SAE(sae.d_in, sae.d_sae, hook_name=sae.hook_name, d_out=sae.d_out, **common)


def same_outputs(a: SAE, b: SAE, x: torch.Tensor) -> bool:
    """Whether two dictionaries give the same latents and outputs on x [..., d_in] (a conversion's check)."""
    with torch.no_grad():
        return torch.equal(a.encode(x), b.encode(x)) and torch.equal(a(x), b(x))


def from_jumprelu(sae: SAE) -> SAE:
    """The BatchTopK dictionary `to_jumprelu` converted (its one threshold, k from its training settings): to
    train it further as it was trained (`interp.finetune_kl`).

    Raises:
        ValueError: the dictionary was not converted from BatchTopK, or its thresholds differ between latents
            (a JumpReLU trained as such).
    """
    if sae.kind == "batchtopk":
        return sae
    k = sae.info.get("settings", {}).get("k")
    if sae.kind != "jumprelu" or sae.info.get("converted_from") != "batchtopk" or not isinstance(k, int):
        raise ValueError(f"from_jumprelu: this {sae.kind!r} dictionary was not converted from a BatchTopK one (info "
                         "has no converted_from 'batchtopk' with settings.k): there is no BatchTopK dictionary to recover")
    threshold = cast(torch.Tensor, sae.threshold)
    if not bool((threshold == threshold[0]).all()):
        raise ValueError("from_jumprelu: the thresholds differ between latents, so they are not one BatchTopK threshold")
    out = _same_shape(sae, kind="batchtopk", k=k)
    out.load_state_dict(sae.state_dict())
    out.model_fingerprint, out.model_config = sae.model_fingerprint, copy.deepcopy(sae.model_config)
    out.info = {key: v for key, v in copy.deepcopy(sae.info).items() if key != "converted_from"}
    return out
