"""SAELens reads our dictionaries: the classes its loader needs for our TopK transcoders, registered on request.

Our SAEs and our ReLU / threshold-kind transcoders are written under SAELens' own architecture names
(`files`), which its `SAE.load_from_disk` reads as they are. SAELens has no TopK transcoder, so
`register_with_saelens()` registers two, "topk_transcoder" and "skip_topk_transcoder", built on its
`Transcoder` and `SkipTranscoder` with the TopK rule of our `kinds.topk` (the k largest pre-activations
of each row, ReLU'd). This module imports SAELens only inside that call: nothing here needs it installed.

SAELens' spliced runs (`HookedSAETransformer.run_with_saes`, `SAETransformerBridge`) replace the output
hook by `decode(encode(x))`, which leaves out a skip transcoder's `x @ W_skip.T`: its own `forward` adds
the term, its splice does not. Run skip transcoders with `interp.run_with_saes` or `interp.spliced`, which
add it, or call the SAELens object's `forward` yourself.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

SKIP_WARNING = ("SAELens' spliced runs (HookedSAETransformer.run_with_saes, SAETransformerBridge) splice "
                "decode(encode(x)) and drop a skip transcoder's W_skip term; splice it with interp.run_with_saes or "
                "interp.spliced, which add it (docs/compatibility.md)")
TOPK_ARCHITECTURES = ("topk_transcoder", "skip_topk_transcoder")


def warn_skip(what: str) -> None:
    """The warning that SAELens' splice drops the skip term, about `what` (a folder, a transcoder)."""
    warnings.warn(f"{what} has a skip term: {SKIP_WARNING}", UserWarning, stacklevel=3)


def register_with_saelens() -> list[str]:
    """Register SAELens classes for our TopK transcoders, so `sae_lens.SAE.load_from_disk(folder)` reads them.

    Returns:
        The architecture names registered by this call ("topk_transcoder", "skip_topk_transcoder"); a
        name already registered (a second call) is left as it is.

    Raises:
        ImportError: SAELens is not installed (`pip install sae-lens`).

    Example:
        >>> interp.saes.register_with_saelens()                                   # doctest: +SKIP
        >>> sae_lens.SAE.load_from_disk("sprout/demo/sprout-mini/saes/transcoder-1")  # doctest: +SKIP
    """
    try:
        from sae_lens import register_sae_class
        from sae_lens.registry import SAE_CLASS_REGISTRY
    except ImportError as e:
        raise ImportError("register_with_saelens needs SAELens: pip install sae-lens") from e
    done = []
    for arch, (cls, cfg_cls) in _topk_classes().items():
        if arch not in SAE_CLASS_REGISTRY:
            register_sae_class(arch, cls, cfg_cls)
            done.append(arch)
    return done


def _topk_classes() -> dict[str, tuple[type, type]]:
    """{architecture: (SAE class, config class)} for the TopK transcoders, on SAELens' base classes."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.transcoder import SkipTranscoder, SkipTranscoderConfig, Transcoder, TranscoderConfig
    from sae_lens.util import filter_valid_dataclass_fields

    def config_class(base: Any, arch: str) -> Any:
        @dataclass
        class Config(base):
            k: int = 32
            rescale_acts_by_decoder_norm: bool = False

            @classmethod
            def architecture(cls) -> str:
                return arch

            @classmethod
            def from_dict(cls, config_dict: dict[str, Any]) -> Any:
                res = cls(**filter_valid_dataclass_fields(config_dict, cls))
                if "metadata" in config_dict:
                    res.metadata = SAEMetadata(**config_dict["metadata"])
                return res

            def to_dict(self) -> dict[str, Any]:
                return {**super().to_dict(), "k": self.k, "rescale_acts_by_decoder_norm": False}

        Config.__name__ = Config.__qualname__ = "".join(p.title() for p in arch.split("_")) + "Config"
        return Config

    def sae_class(base: Any, cfg_cls: Any) -> Any:
        class TopKTranscoder(base):
            def encode(self, x: torch.Tensor) -> torch.Tensor:
                pre = self.hook_sae_acts_pre(self.process_sae_in(x) @ self.W_enc + self.b_enc)
                values, indices = pre.topk(self.cfg.k, dim=-1, sorted=False)
                return self.hook_sae_acts_post(torch.zeros_like(pre).scatter_(-1, indices, values.relu()))

            @classmethod
            def from_dict(cls, config_dict: dict[str, Any]) -> Any:
                return cls(cfg_cls.from_dict(config_dict))

        TopKTranscoder.__name__ = TopKTranscoder.__qualname__ = cfg_cls.__name__.removesuffix("Config")
        return TopKTranscoder

    out = {}
    for arch, base, base_cfg in (("topk_transcoder", Transcoder, TranscoderConfig),
                                 ("skip_topk_transcoder", SkipTranscoder, SkipTranscoderConfig)):
        cfg_cls = config_class(base_cfg, arch)
        out[arch] = (sae_class(base, cfg_cls), cfg_cls)
    return out
