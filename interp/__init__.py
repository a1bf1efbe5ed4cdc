"""interp: analyses of hooked models (Sprout, the walkthrough GPT) as pure functions returning DataFrames.

Every analysis reads activations through TransformerLens' canonical hook names only, caches only the
hooks it needs, runs in batches under `torch.inference_mode()`, and never plots or writes files (that
is `figures` and `experiments`).

The package is in rooms, one per question a user comes with; each room's `__all__` is its whole API,
and the names below are the headline analyses of each:

    interp.data       probe material: held-out stories, everyday English, repeated random tokens
    interp.lens       what does each layer predict? logit lens, tuned lens, direct logit attribution
    interp.heads      what does each head do? head scores, attention, composition, ablation
    interp.patching   what carries the behaviour? activation, attribution and path patching
    interp.induction  the chapter's study of induction (built from the rooms above)
    interp.measures   numbers about the whole model: losses, residual RMS, parameters, RoPE
    interp.saes       dictionaries: SAEs and transcoders (training in interp.saes.training)
    interp.graphs     how is one prediction computed? attribution graphs through transcoders
    interp.discovery  which edges carry a task? circuit discovery scored against planted circuits
"""
# what an analysis takes: a model, heads and components; the identity saved files record
from ._core.identity import fingerprint
from ._core.model import HookedModel
from ._core.specs import Component, Head

# probe material
from .data import everyday_english, held_out_stories, repeated_tokens

# discovery: the circuit of a task, found edge by edge
from .discovery import discover, edge_graph, edge_scores, faithfulness_curve, planted

# graphs: one prediction traced through features (attribution graphs)
from .graphs import Graph, ReplacementModel, attribute, graph_json, graph_scores, head_loadings, intervene, prune_graph

# heads: what each head does
from .heads import ablate_heads, attention_patterns, composition_scores, head_scores, ov_copying_scores, positional_qk_scores

# induction: the chapter's study
from .induction import (
    circuit_spread,
    control_pairs,
    icl_score,
    induction_circuit,
    induction_stories,
    induction_table,
    phase_change,
    phase_heads,
    phase_measures,
    phase_table,
    spread_ranges,
    spread_sentences,
)

# lens: what each layer predicts, and who writes a logit
from .lens import (
    TunedLens,
    first_top1_layer,
    lens_comparison,
    lens_dataset_summary,
    lens_summary,
    load_tuned_lens,
    logit_attribution,
    logit_lens,
    train_tuned_lens,
    tuned_lens,
)

# measures: the model as a whole
from .measures import loss_table, mean_loss, param_table, repeat_loss, residual_rms, rope_distance_check

# patching: which activation or path carries the behaviour
from .patching import attribution_patch, attribution_summary, patch, path_patch

# saes: dictionaries (training apart)
from .saes import (
    SAE,
    CrossLayerTranscoder,
    Transcoder,
    describe_latent,
    interpretability_score,
    interpretability_summary,
    load_clt,
    load_sae,
    load_transcoder,
    run_with_saes,
    sae_metrics,
    spliced,
)
from .saes.training import finetune_kl, train_clt, train_sae, train_transcoder

__all__ = [
    # model, heads and components, identity
    "Component", "Head", "HookedModel", "fingerprint",
    # probe material
    "everyday_english", "held_out_stories", "repeated_tokens",
    # discovery
    "discover", "edge_graph", "edge_scores", "faithfulness_curve", "planted",
    # graphs
    "Graph", "ReplacementModel", "attribute", "graph_json", "graph_scores", "head_loadings", "intervene", "prune_graph",
    # lens
    "TunedLens", "first_top1_layer", "lens_comparison", "lens_dataset_summary", "lens_summary", "load_tuned_lens",
    "logit_attribution", "logit_lens", "train_tuned_lens", "tuned_lens",
    # heads
    "ablate_heads", "attention_patterns", "composition_scores", "head_scores", "ov_copying_scores",
    "positional_qk_scores",
    # patching
    "attribution_patch", "attribution_summary", "patch", "path_patch",
    # induction
    "circuit_spread", "control_pairs", "icl_score", "induction_circuit", "induction_stories", "induction_table",
    "phase_change", "phase_heads", "phase_measures", "phase_table", "spread_ranges", "spread_sentences",
    # measures
    "loss_table", "mean_loss", "param_table", "repeat_loss", "residual_rms", "rope_distance_check",
    # saes
    "SAE", "CrossLayerTranscoder", "Transcoder", "describe_latent", "interpretability_score", "interpretability_summary", "load_clt",
    "finetune_kl", "load_sae", "load_transcoder", "run_with_saes", "sae_metrics", "spliced", "train_clt", "train_sae",
    "train_transcoder",
]
