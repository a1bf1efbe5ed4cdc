"""What does each attention head do? Pattern scores, attention maps, weight-based composition, ablation.

    scores.py       previous-token, duplicate-token, induction and prefix-matching scores
    attention.py    attention patterns as a tensor or a tidy frame
    composition.py  Q/K/V composition between heads, OV copying, positional QK scores (from the weights)
    ablation.py     zero or mean ablation of heads, and the loss it costs
"""
from .ablation import ablate_heads, ablation_hooks
from .attention import attention_patterns, pattern_tensor
from .composition import composition_scores, ov_copying_scores, positional_qk_scores
from .scores import SCORE_KINDS, head_score_tensor, head_scores, target_mask

__all__ = ["SCORE_KINDS", "ablate_heads", "ablation_hooks", "attention_patterns", "composition_scores", "head_score_tensor", "head_scores",
           "ov_copying_scores", "pattern_tensor", "positional_qk_scores", "target_mask"]
