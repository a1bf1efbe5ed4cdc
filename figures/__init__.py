"""Plotly builders: analysis DataFrames in, `plotly.graph_objects.Figure` out.

They never see a model, never call `show()` and never write files; `experiments` does that.
"""
from .attention import attention_grid, attention_heatmap
from .circuits import attribution_scatter, circuit_graph, composition_heatmap, dla_bars, path_patching_matrix, phase_change
from .features import feature_card, feature_overview
from .heads import ablation_bars, head_scores
from .induction import induction_over_training, induction_table
from .lens import logit_lens_grid
from .params import param_breakdown
from .residual import residual_rms
from .rope import rope_distance
from .style import escape_token
from .training import loss_curves
from .tuned_lens import lens_comparison_curves, lens_side_by_side

__all__ = [
    "attribution_scatter", "circuit_graph", "composition_heatmap", "dla_bars", "path_patching_matrix", "phase_change",
    "ablation_bars", "attention_grid", "feature_card", "feature_overview", "attention_heatmap", "escape_token", "head_scores",
    "induction_over_training", "induction_table", "logit_lens_grid", "loss_curves", "param_breakdown",
    "residual_rms", "rope_distance", "lens_comparison_curves", "lens_side_by_side",
]
