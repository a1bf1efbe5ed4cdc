"""The contract walk over every public dictionary and splice entry point (issue 36): each argument given
hostile values (bools for numbers, 1.7 for counts, NaN and infinities, strings for booleans, out-of-range
and empty values) is refused with a ValueError or TypeError that names the argument, before any work.
A new entry point in `interp.saes.__all__` (or the feature functions) must join the table."""
import math
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
import pytest
import torch

import interp
import interp.saes
from interp.saes import features
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

D = TINY.d_model
HOOK = "blocks.0.hook_resid_post"
ACTS = torch.randn(256, D, generator=torch.Generator().manual_seed(0))
IDS = torch.randint(0, TINY.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
QUICK = dict(kind="topk", d_sae=16, k=2, steps=2, batch_size=64, progress=False)

COUNT = [0, -1, 1.5, True, "3", math.nan]  # an integer >= 1
FLAG = ["no", 1, None]  # True or False
SEED = [1.7, -1, True, "0"]
RATE = [math.nan, math.inf, -1.0, "0.1", True]  # a positive finite number


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def _sae():
    return interp.SAE(D, 16, kind="topk", k=2, hook_name=HOOK, seed=1)


def _splice(model, **kw):
    with ExitStack() as stack:
        stack.enter_context(interp.spliced(model, kw.pop("saes", [_sae()]), **kw))


def _run(model, **kw):
    args = {"tokens": IDS, "saes": [_sae()], **kw}
    return interp.run_with_saes(model, args.pop("tokens"), args.pop("saes"), **args)


def _metrics(model, **kw):
    return interp.sae_metrics(model, kw.pop("sae", _sae()), kw.pop("data", IDS), **kw)


_SCORES = pd.DataFrame({"source": ["dictionary"], "auroc": [0.9]})


def _tmp() -> Path:
    return Path(tempfile.mkdtemp()) / "set"


def _clamp(model, **kw):
    args = {"latent": 0, "value": 1.0, **kw}
    return features.clamp_effect(model, kw.pop("sae", _sae()), args.pop("latent"), IDS, **{k: v for k, v in args.items()
                                                                                           if k != "sae"})


# entry point -> (how to call it with one argument changed, {argument: hostile values})
TABLE = {
    "SAE": (lambda m, **kw: interp.SAE(**{"d_in": D, "d_sae": 16, **kw}),
            {"d_in": COUNT, "d_sae": COUNT, "k": [0, 17, 1.5, True], "kind": ["TopK", 3, None], "seed": SEED,
             "bandwidth": [0, math.nan, -0.1, "0.05"], "hook_name": ["", 3], "dtype": [torch.int64, "float32"],
             "d_out": [0, 1.5, True]}),
    "Transcoder": (lambda m, **kw: interp.Transcoder(**{"d_in": D, "d_sae": 16, **kw}),
                   {"d_in": COUNT, "d_sae": COUNT, "d_out": [0, 1.5, True], "skip": FLAG, "layer": [-1, 1.5, True, "1"],
                    "hook_name": ["", 3], "hook_name_out": ["", 3], "seed": SEED}),
    "CrossLayerTranscoder": (lambda m, **kw: interp.CrossLayerTranscoder(**{"n_layers": 2, "d_in": D, "d_sae": 16, **kw}),
                             {"n_layers": COUNT, "d_in": COUNT, "d_sae": COUNT, "d_out": [0, 1.5, True], "skip": FLAG,
                              "seed": SEED, "kind": ["topk", 3, None], "k": [0, 33, 1.5, True],
                              "dtype": [torch.int64, "float32"]}),
    "clt_metrics": (lambda m, **kw: interp.saes.clt_metrics(m, kw.pop("clt", interp.CrossLayerTranscoder(2, D, 8)), IDS, **kw),
                    {"clt": [object(), [_sae()]], "batch_size": COUNT}),
    "clt_dead_fractions": (lambda m, **kw: interp.saes.clt_dead_fractions(m, kw.pop("clt", interp.CrossLayerTranscoder(2, D, 8)),
                                                                            IDS, **kw),
                           {"clt": [object(), [_sae()]], "batch_size": COUNT}),
    "train_sae": (lambda m, **kw: interp.train_sae(ACTS, **{**QUICK, **kw}),
                  {"steps": COUNT, "lr": RATE + [0.0], "batch_size": COUNT, "seed": SEED, "d_sae": COUNT,
                   "k": [0, 1.5, True], "kind": ["TopK", 3], "stop_at": [0, -5, 1.5, 99, True],
                   "checkpoint_every": [0, 1.5, True], "resume": FLAG[:2], "progress": FLAG, "grad_clip": [math.nan, -1.0],
                   "decay_fraction": [math.nan, 1.5], "normalize": ["no", 1], "warmup_steps": [-1, 1.5]}),
    "train_transcoder": (lambda m, **kw: interp.train_transcoder(m, IDS, **{"layer": 0, **QUICK, **kw}),
                         {"layer": [-1, 2, 1.5, True, [0, 0], [], "0"], "skip": FLAG[:2], "steps": COUNT,
                          "stop_at": [0, -5, 1.5], "seed": SEED}),
    "load_sae": (lambda m, **kw: interp.load_sae(m, **{"hook": HOOK, **kw}), {"hook": ["", 3, None]}),
    "load_transcoder": (lambda m, **kw: interp.load_transcoder(m, **{"layer": 0, **kw}), {"layer": [-1, 2, 1.5, True, "0"]}),
    "load_clt": (lambda m, **kw: interp.load_clt(m, **kw), {"root": [3, True, object()]}),
    "spliced": (_splice, {"saes": [object(), [], [_sae(), _sae()], [interp.SAE(D, 16, hook_name="blocks.9.hook_resid_post")]],
                          "use_error_term": FLAG}),
    "run_with_saes": (_run, {"saes": [object(), []], "use_error_term": FLAG,
                             "tokens": [IDS.float(), torch.zeros(1, TINY.context + 1, dtype=torch.long)]}),
    "sae_metrics": (_metrics, {"batch_size": COUNT, "seq_len": [0, 1.5, True], "dense_threshold": [math.nan, 1.5, -0.1, "0.1"],
                               "attention_mask": [torch.full(IDS.shape, 0.5), torch.full(IDS.shape, 2)],
                               "sae": [object()]}),
    "clamp_effect": (_clamp, {"value": [math.nan, math.inf, "3", True], "latent": [1.7, True, -1, 16],
                              "k": [0, 1.5, True], "batch_size": [0, 1.5, True]}),
    "feature_report": (lambda m, **kw: features.feature_report(m, _sae(), IDS, **kw),
                       {"n_show": [0, 1.5, True], "n_examples": [0, 1.5], "k": [0, 1.5], "batch_size": [0, 1.5],
                        "latents": [[1.7], [16], [-1]]}),
    "logit_effects": (lambda m, **kw: features.logit_effects(m, _sae(), **kw), {"k": [0, 1.5, True, TINY.vocab_size + 1]}),
    "dead_fractions": (lambda m, **kw: interp.saes.dead_fractions(m, kw.pop("saes", [_sae()]), IDS, **kw),
                       {"saes": [object(), []], "batch_size": COUNT, "seq_len": [0, 1.5, True]}),
    "describe_latent": (lambda m, **kw: interp.describe_latent(m, _sae(), kw.pop("latent", 0), IDS, IDS, **kw),
                        {"latent": [1.7, True, -1, 16], "max_units": COUNT, "min_count": COUNT, "n_contexts": COUNT,
                         "seed": SEED}),
    "interpretability_score": (lambda m, **kw: interp.interpretability_score(m, _sae(), IDS, IDS, **kw),
                               {"n": COUNT, "baselines": FLAG, "seed": SEED, "max_units": COUNT, "min_count": COUNT}),
    "interpretability_summary": (lambda m, **kw: interp.interpretability_summary(kw.pop("scores", _SCORES), **kw),
                                 {"scores": [object(), "auroc"], "good": [math.nan, -0.1, 1.5, "0.8", True]}),
    "save_circuit_tracer": (lambda m, **kw: interp.saes.save_circuit_tracer(kw.pop("transcoders", []), _tmp(), m, **kw),
                            {"transcoders": [object(), [], [_sae()]]}),
    "load_circuit_tracer": (lambda m, **kw: interp.saes.load_circuit_tracer(kw.pop("folder", _tmp()), m),
                            {"folder": [3, None]}),
}
# types (walked by tests/robustness/test_contract_settings.py), and a call that takes no argument
NOT_CALLS = {"SettingsError", "TrainSettings", "register_with_saelens"}


def test_the_table_walks_every_public_entry_point():
    public = set(interp.saes.__all__) - NOT_CALLS
    public |= {n for n in ("feature_report", "clamp_effect", "logit_effects") if callable(getattr(features, n))}
    assert public <= set(TABLE), f"add {sorted(public - set(TABLE))} to TABLE in {__file__}"


CASES = [(name, arg, value) for name, (_, args) in TABLE.items() for arg, values in args.items() for value in values]


def _case_id(name: str, arg: str, value: object, i: int) -> str:
    """A stable id (pytest-xdist's workers must collect the same names): no object address in it."""
    shown = "object()" if type(value) is object else repr(value)
    return f"{i}-{name}-{arg}-{shown}"[:60]


@pytest.mark.parametrize("name, arg, value", CASES, ids=[_case_id(n, a, v, i) for i, (n, a, v) in enumerate(CASES)])
def test_hostile_values_are_refused_naming_the_argument(model, name, arg, value):
    call, _ = TABLE[name]
    with pytest.raises((ValueError, TypeError)) as err:
        call(model, **{arg: value})
    message = str(err.value)
    named = {"saes": ("SAE", "dictionar", "transcoder", "hook"), "sae": ("SAE", "dictionar", "transcoder"),
             "transcoders": ("transcoder", "Transcoder"), "scores": ("scores", "auroc", "source"),
             "tokens": ("token", "sequence"), "d_in": ("d_in",), "hook": ("hook",)}.get(arg, (arg,))
    assert any(word in message for word in named), f"{name}({arg}={value!r}) raised without naming {arg}: {message}"
