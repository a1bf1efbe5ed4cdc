"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"; circuit-tracer's conventions and formats).

    dictionaries.py  the transcoders a graph runs on (the extension point for cross-layer sets)
    replacement.py   ReplacementModel: patterns and norm scales frozen, MLPs replaced by transcoders + errors
    attribution.py   attribute: the graph of one prompt, rows by batched backward passes
    graph.py         Graph: adjacency and node tables with circuit-tracer's field names, save / load
    prune.py         prune_graph, graph_scores (replacement and completeness scores)
    export.py        graph_json: circuit-tracer's graph JSON (its page's and Neuronpedia's format)
    heads.py         head_loadings: edges split exactly over one block's attention heads
    interventions.py intervene: set or scale features in the real model, measured beside the graph's prediction
    finding.py       name_copy: the graph of copying a repeated name's next piece, summarised as supernodes
"""
from .attribution import attribute
from .dictionaries import Dictionaries
from .export import graph_json
from .finding import SUPERNODES, CopySite, NameCopy, copy_interventions, copy_site, name_copy
from .graph import Graph
from .heads import head_loadings
from .interventions import intervene
from .prune import PrunedGraph, graph_scores, prune_graph
from .replacement import ReplacementModel

__all__ = ["SUPERNODES", "CopySite", "Dictionaries", "Graph", "NameCopy", "PrunedGraph", "ReplacementModel", "attribute",
           "copy_interventions", "copy_site", "graph_json", "graph_scores", "head_loadings", "intervene", "name_copy",
           "prune_graph"]
