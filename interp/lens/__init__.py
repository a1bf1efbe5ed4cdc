"""What does the model predict at each layer? The logit lens, the tuned lens (and its trainer), and
direct logit attribution (which component writes a logit).

    logit.py                     the logit lens: each residual stream read through the final norm and unembedding
    tuned.py                     the tuned lens (Belrose et al. 2023): a trained affine translator per layer
    train.py                     train_tuned_lens, and its command line (`python -m interp.lens.train`)
    settings.py                  the checked settings of a tuned-lens training run
    direct_logit_attribution.py  each head's, MLP's and the embedding's share of a logit
"""
from .direct_logit_attribution import logit_attribution
from .logit import first_top1_layer, lens_dataset_summary, lens_summary, logit_lens
from .settings import TunedLensSettings
from .train import train_tuned_lens
from .tuned import TunedLens, lens_comparison, load_tuned_lens, tuned_lens

__all__ = ["TunedLens", "TunedLensSettings", "first_top1_layer", "lens_comparison", "lens_dataset_summary",
           "lens_summary", "load_tuned_lens", "logit_attribution", "logit_lens", "train_tuned_lens", "tuned_lens"]
