"""interp: analyses of hooked models (Sprout, the walkthrough GPT) as pure functions returning DataFrames.

Every analysis reads activations through TransformerLens' canonical hook names only, caches only the
hooks it needs, runs in batches under `torch.inference_mode()`, and never plots or writes files (that
is `figures` and `experiments`).
"""
from .ablation import ablate_heads
from .attention import attention_patterns, pattern_tensor
from .heads import KINDS, head_score_tensor, head_scores, repeated_tokens, target_mask
from .induction import induction_stories, induction_table, story_names
from .lens import first_top1_layer, lens_dataset_summary, lens_summary, logit_lens
from .loss import mean_loss, repeat_loss
from .params import param_table
from .residual import LogHistogram, residual_rms
from .rope import rope_distance_check
from .texts import HELD_OUT_SEED, held_out_stories
from .tuned_lens import TunedLens, lens_comparison, load_tuned_lens, tuned_lens
from .tuned_lens_train import train_tuned_lens

__all__ = [
    "HELD_OUT_SEED", "KINDS", "LogHistogram", "ablate_heads", "attention_patterns", "first_top1_layer",
    "head_score_tensor", "head_scores", "held_out_stories", "induction_stories", "induction_table",
    "lens_dataset_summary", "lens_summary", "logit_lens", "mean_loss", "param_table", "pattern_tensor",
    "repeat_loss", "repeated_tokens", "residual_rms", "rope_distance_check", "story_names", "target_mask",
    "TunedLens", "lens_comparison", "load_tuned_lens", "train_tuned_lens", "tuned_lens",
]
