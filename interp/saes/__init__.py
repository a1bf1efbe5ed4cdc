"""Dictionary learning: sparse autoencoders and transcoders for any hooked model here.

    sae.py      the SAE and Transcoder classes (SAELens' parameter names and shapes)
    kinds.py    each kind's sparsity rule: relu, topk, batchtopk, jumprelu, matryoshka
    files.py    SAELens' folder layout, reading ours and theirs; the shipped dictionaries
    metrics.py  reconstruction, sparsity and the spliced model's loss
    splice.py   dictionaries spliced into the forward, their latents as hook points
"""
from .files import load_sae, load_transcoder
from .metrics import sae_metrics
from .sae import SAE, Transcoder
from .splice import run_with_saes, spliced

__all__ = ["SAE", "Transcoder", "load_sae", "load_transcoder"]
__all__ += ["run_with_saes", "sae_metrics", "spliced"]
