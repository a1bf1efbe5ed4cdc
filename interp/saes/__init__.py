"""Dictionaries: sparse autoencoders and transcoders, their metrics, splicing and features."""
from .metrics import sae_metrics
from .splice import run_with_saes, spliced

__all__ = ["run_with_saes", "sae_metrics", "spliced"]
