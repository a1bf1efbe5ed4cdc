"""Which activation, or which path between heads, carries the behaviour? Interventions between a clean and
a corrupted run, measured by a metric of the logits (the batched engine is in `interp._core`).

    activation.py   activation patching by site, layer, position and head
    attribution.py  attribution patching: the gradient's linear estimate of every patch at once
    path.py         path patching: a sender's effect through one receiver's query, key or value
    joint.py        sets of senders patched together, and a greedy search for the feeders of a receiver
"""
from .activation import SITES, patch, patch_tensor
from .attribution import attribution_patch, attribution_summary
from .joint import GREEDY_COLUMNS, greedy_feeders, joint_path_patch
from .path import path_patch

__all__ = ["GREEDY_COLUMNS", "SITES", "attribution_patch", "attribution_summary", "greedy_feeders", "joint_path_patch", "patch",
           "patch_tensor", "path_patch"]
