"""Dictionary learning: sparse autoencoders and transcoders for any hooked model here.

    sae.py      the SAE and Transcoder classes (SAELens' parameter names and shapes)
    kinds.py    each kind's sparsity rule: relu, topk, batchtopk, jumprelu, matryoshka
    files.py    SAELens' folder layout, reading ours and theirs
    saelens.py  register_with_saelens: SAELens classes for our TopK transcoders
    transcoder_sets.py  circuit-tracer's transcoder folders, written and read
    shipped.py  the demos' dictionaries, found by fingerprint (load_sae, load_transcoder)
    settings.py the checked settings of a training run
    harvest.py  activations for training: a tensor, or a model run over text in buffered blocks
    train.py    train_sae / train_transcoder (one process or torchrun)
    checkpoint.py  a run's checkpoint, to resume
    metrics.py  reconstruction, sparsity and the spliced model's loss
    splice.py   dictionaries spliced into the forward, their latents as hook points
    features.py what latents fire on and write: top contexts, histograms, logit effects, clamping
"""
from .metrics import sae_metrics
from .sae import SAE, Transcoder
from .saelens import register_with_saelens
from .settings import SettingsError, TrainSettings
from .shipped import load_sae, load_transcoder
from .splice import run_with_saes, spliced
from .train import train_sae, train_transcoder
from .transcoder_sets import load_circuit_tracer, save_circuit_tracer

__all__ = ["SAE", "SettingsError", "TrainSettings", "Transcoder", "load_sae", "load_transcoder", "train_sae",
           "train_transcoder"]
__all__ += ["load_circuit_tracer", "register_with_saelens", "run_with_saes", "sae_metrics", "save_circuit_tracer", "spliced"]
