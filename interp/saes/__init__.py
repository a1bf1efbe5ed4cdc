"""Dictionary learning: sparse autoencoders and transcoders for any hooked model here (training is in
`interp.saes.training`, apart, as in SAELens).

    sae.py       the SAE and Transcoder classes (SAELens' parameter names and shapes)
    kinds/       each kind's sparsity rule: relu, topk, batchtopk, jumprelu, matryoshka
    files.py     SAELens' folder layout, reading ours and theirs
    shipped.py   the demos' dictionaries, found by fingerprint (load_sae, load_transcoder)
    metrics.py   reconstruction, sparsity and the spliced model's loss
    splice.py    dictionaries spliced into the forward, their latents as hook points
    features.py  what latents fire on and write: top contexts, histograms, logit effects, clamping
    training/    train_sae / train_transcoder, their settings, activation harvesting, checkpoints
"""
from .metrics import dead_fractions, sae_metrics
from .sae import SAE, Transcoder
from .shipped import load_sae, load_transcoder
from .splice import run_with_saes, spliced

__all__ = ["SAE", "Transcoder", "dead_fractions", "load_sae", "load_transcoder", "run_with_saes", "sae_metrics", "spliced"]
