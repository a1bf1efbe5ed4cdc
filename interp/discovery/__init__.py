"""Circuit discovery at the level of edges, scored against exact patching and planted circuits.

`edge_graph` (the graph), `edge_scores` (a score per edge by one method), `discover` (a circuit),
`faithfulness_curve` / `faithfulness_areas` (MIB's curve, CPR, CMD), `roc_auc` (against a known truth),
`patch_edges` (the metric with chosen edges ablated). Planted models with known circuits: `interp.planted`.
"""
from . import planted
from .discover import METHODS, Circuit, discover, edge_scores
from .edges import EdgeGraph, edge_graph
from .faithfulness import GRID, faithfulness_areas, faithfulness_curve, roc_auc
from .patching import ABLATIONS, patch_edges

__all__ = ["ABLATIONS", "Circuit", "EdgeGraph", "GRID", "METHODS", "discover", "edge_graph", "edge_scores",
           "faithfulness_areas", "faithfulness_curve", "patch_edges", "planted", "roc_auc"]
