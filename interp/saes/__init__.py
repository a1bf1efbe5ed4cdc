"""Dictionary learning: sparse autoencoders and transcoders for any hooked model here (training is in
`interp.saes.training`, apart, as in SAELens).

    sae.py       the SAE and Transcoder classes (SAELens' parameter names and shapes)
    clt.py       CrossLayerTranscoder: one dictionary for every MLP, features writing to all later layers
    clt_files.py its folder (cfg.json + sae_weights.safetensors), checked on the way in
    clt_metrics.py  a CLT's (or a per-layer set's) reconstruction, sparsity and loss with every MLP replaced
    kinds/       each kind's sparsity rule: relu, topk, batchtopk, jumprelu, matryoshka
    files.py     SAELens' folder layout, reading ours and theirs
    saelens.py   register_with_saelens: SAELens classes for our TopK transcoders
    transcoder_sets.py  circuit-tracer's transcoder folders, written and read
    shipped.py   the demos' dictionaries, found by fingerprint (load_sae, load_transcoder, load_clt)
    metrics.py   reconstruction, sparsity and the spliced model's loss
    baselines.py what a dictionary must beat at the same L0: a PCA code, regression, the MLP's top neurons
    splice.py    dictionaries spliced into the forward, their latents as hook points
    features.py  what latents fire on and write: top contexts, histograms, logit effects, clamping
    clamp.py     clamping against random latents and random directions clamped the same way
    describe.py  a latent's description chosen on one text, scored on another (precision, recall, AUROC)
    score.py     a whole dictionary's interpretability score beside PCA and random directions
    convert.py   BatchTopK as JumpReLU with the same outputs (the kind circuit-tracer reads)
    training/    train_sae / train_transcoder, their settings, activation harvesting, checkpoints
"""
from .clt import CrossLayerTranscoder
from .clt_metrics import clt_dead_fractions, clt_metrics
from .describe import describe_latent
from .metrics import dead_fractions, sae_metrics
from .sae import SAE, Transcoder
from .saelens import register_with_saelens
from .score import interpretability_score, interpretability_summary
from .shipped import load_clt, load_sae, load_transcoder
from .splice import run_with_saes, spliced
from .transcoder_sets import load_circuit_tracer, save_circuit_tracer

__all__ = ["SAE", "CrossLayerTranscoder", "Transcoder", "clt_dead_fractions", "clt_metrics", "dead_fractions", "describe_latent",
           "interpretability_score", "interpretability_summary", "load_circuit_tracer", "load_clt", "load_sae", "load_transcoder",
           "register_with_saelens", "run_with_saes", "sae_metrics", "save_circuit_tracer", "spliced"]
