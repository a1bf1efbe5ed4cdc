"""Training dictionaries (apart from `interp.saes`, as in SAELens: loading one never imports the trainer).

    settings.py    the checked settings of a training run
    harvest.py     activations for training: a tensor, or a model run over text in buffered blocks
    train.py       train_sae / train_transcoder (one process or torchrun)
    clt.py         train_clt: a cross-layer transcoder for every MLP at once, on the same core
    finetune.py    finetune_kl: a trained dictionary fine-tuned on the model's next-token distribution
    checkpoint.py  a run's checkpoint, to resume
    cli.py         `python -m interp.saes.training`: the command, its flags generated from TrainSettings

The optimizer, gradient reduction, clipping and resume check are the trainers' shared core,
`sprout.training.core`.
"""
from ..settings import SettingsError, TrainSettings
from .clt import train_clt
from .finetune import finetune_kl
from .train import train_sae, train_transcoder

__all__ = ["SettingsError", "TrainSettings", "finetune_kl", "train_clt", "train_sae", "train_transcoder"]
