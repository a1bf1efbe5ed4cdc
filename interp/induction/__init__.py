"""The chapter's study of induction, built only from the other rooms' public names.

    stories.py  a model's probability of a name's later occurrences in stories
    circuit.py  the induction circuit: heads, their senders, composition, ablation and joint path patching
    spread.py   how the circuit's shares move across seeds, lengths and data
    phase.py    the phase change over training snapshots
"""
from .circuit import induction_circuit
from .phase import control_pairs, icl_score, phase_change, phase_heads, phase_measures, phase_table
from .spread import circuit_spread, spread_ranges, spread_sentences
from .stories import induction_stories, induction_table, story_names

__all__ = ["circuit_spread", "control_pairs", "icl_score", "induction_circuit", "induction_stories",
           "induction_table", "phase_change", "phase_heads", "phase_measures", "phase_table", "spread_ranges",
           "spread_sentences", "story_names"]
