"""Dictionary learning: sparse autoencoders and transcoders for any hooked model here.

    sae.py      the SAE and Transcoder classes (SAELens' parameter names and shapes)
    kinds.py    each kind's sparsity rule: relu, topk, batchtopk, jumprelu, matryoshka
    files.py    SAELens' folder layout, reading ours and theirs; the shipped dictionaries
"""
from .files import load_sae, load_transcoder
from .sae import SAE, Transcoder

__all__ = ["SAE", "Transcoder", "load_sae", "load_transcoder"]
