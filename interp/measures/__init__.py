"""Numbers about a model as a whole: its loss against baselines, the residual stream's size, its
parameters, RoPE's distance behaviour.

    loss.py      mean loss, the repeated-half loss, the loss table against uniform, unigram and n-gram baselines
    ngram.py     interpolated Kneser-Ney bigram and trigram models over token ids (the loss table's baselines)
    residual.py  the residual stream's RMS at every site
    params.py    where the parameters are
    rope.py      RoPE's scores depend on the distance only
"""
from .loss import loss_table, mean_loss, repeat_loss, unigram_log_probs
from .ngram import KneserNey
from .params import param_table
from .residual import LogHistogram, residual_rms
from .rope import rope_distance_check

__all__ = ["KneserNey", "LogHistogram", "loss_table", "mean_loss", "param_table", "repeat_loss", "residual_rms",
           "rope_distance_check", "unigram_log_probs"]
