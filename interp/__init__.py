"""interp: analyses of hooked models (Sprout, the walkthrough GPT) as pure functions returning DataFrames.

Every analysis reads activations through TransformerLens' canonical hook names only, caches only the
hooks it needs, runs in batches under `torch.inference_mode()`, and never plots or writes files (that
is `figures` and `experiments`).
"""
from ._inputs import stream_windows, windows
from ._model import HookedModel
from ._specs import Component, Head
from .ablation import ablate_heads
from .attention import attention_patterns, pattern_tensor
from .attribution_patching import attribution_patch, attribution_summary
from .circuit import induction_circuit
from .circuit_spread import circuit_spread, spread_ranges, spread_sentences
from .composition import composition_scores, ov_copying_scores, positional_qk_scores
from .direct_logit_attribution import logit_attribution
from .graphs import Graph, ReplacementModel, attribute, graph_json, graph_scores, head_loadings, intervene, prune_graph
from .discovery import discover, edge_graph, edge_scores, faithfulness_curve, planted
from .heads import KINDS, head_score_tensor, head_scores, repeated_tokens, target_mask
from .induction import induction_stories, induction_table, story_names
from .lens import first_top1_layer, lens_dataset_summary, lens_summary, logit_lens
from .loss import loss_table, mean_loss, repeat_loss, unigram_log_probs
from .params import param_table
from .patching import SITES, patch, patch_tensor
from .path_patching import path_patch
from .phase import control_pairs, icl_score, phase_change, phase_heads, phase_measures, phase_table
from .residual import LogHistogram, residual_rms
from .rope import rope_distance_check
from .saes import SAE, Transcoder, load_sae, load_transcoder, run_with_saes, sae_metrics, spliced, train_sae, train_transcoder
from .texts import HELD_OUT_SEED, everyday_english, held_out_stories
from .tuned_lens import TunedLens, lens_comparison, load_tuned_lens, tuned_lens
from .tuned_lens_train import train_tuned_lens

__all__ = [
    "ablate_heads", "attention_patterns", "Component", "Head", "attribution_patch", "attribution_summary", "circuit_spread",
    "composition_scores", "control_pairs", "everyday_english", "first_top1_layer", "head_score_tensor", "head_scores",
    "HELD_OUT_SEED", "held_out_stories", "HookedModel", "icl_score",
    "induction_circuit", "induction_stories", "induction_table", "KINDS", "lens_comparison", "lens_dataset_summary",
    "lens_summary", "load_tuned_lens", "LogHistogram", "logit_attribution", "logit_lens", "loss_table", "mean_loss",
    "ov_copying_scores", "param_table", "patch", "patch_tensor", "path_patch", "pattern_tensor", "phase_change", "phase_heads",
    "phase_measures", "phase_table", "positional_qk_scores", "repeat_loss", "repeated_tokens", "residual_rms",
    "rope_distance_check", "SAE", "SITES", "spread_ranges", "spread_sentences", "story_names", "Transcoder", "load_sae",
    "load_transcoder", "train_sae", "train_transcoder", "target_mask", "train_tuned_lens", "tuned_lens", "TunedLens",
    "run_with_saes", "sae_metrics", "spliced", "stream_windows", "unigram_log_probs", "windows",
    "discover", "edge_graph", "edge_scores", "faithfulness_curve", "planted",
]
__all__ += ["Graph", "ReplacementModel", "attribute", "graph_json", "graph_scores", "head_loadings", "intervene",
            "prune_graph"]
