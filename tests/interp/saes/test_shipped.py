"""The dictionaries shipped under sprout/demo/*/saes/ meet issue 25's targets on held-out text they were
not trained on, recomputed from the files by code of its own: the weights read with safetensors, encode
and decode written out here, and the splice made with plain TransformerLens hooks (nothing of
interp.saes runs, except to check that its loader finds each dictionary for these weights).

Held-out text: for a demo trained on English (its recipe.json), each source's held-out text past the
part `experiments.ship` measured on; for a stories demo, stories of a seed no run uses. EV, L0 and CE
recovered are measured on HELD_TOKENS tokens, the dead fraction over DEAD_TOKENS.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import interp
import sprout
from interp.data import stream_windows as tuned_lens_windows
from interp.saes.shipped import shipped_folder
from sprout.files import demo_dir
from sprout.names import act_name
from sprout.training.english import is_english
from sprout.training.recipes import Recipe, recipe_corpus

HELD_TOKENS, DEAD_TOKENS, SEQ = 2048, 40_960, 128
TARGETS = {False: (0.93, 0.97), True: (0.90, 0.95)}  # transcoder? -> (explained variance, CE loss recovered)
MAX_L0, MAX_DEAD = 32, 0.05
STORY_SEED = 777_001  # held-out stories no training or shipping run reads
DEMOS = ("gpt-4", "sprout-mini")  # the demos with a dictionary recipe (experiments/ship.py)


def dictionaries(root: Path) -> list[dict]:
    """Every dictionary folder under root/saes/, read by hand: cfg.json and the safetensors weights."""
    out = []
    for folder in sorted((root / "saes").glob("*/")):
        cfg = json.loads((folder / "cfg.json").read_text())
        out.append(dict(folder=folder, cfg=cfg, ours=cfg["metadata"]["sprout"],
                        w={k: v.double() for k, v in load_file(folder / "sae_weights.safetensors").items()}))
    return out


def encode(d: dict, x: torch.Tensor) -> torch.Tensor:
    """The latents [n, d_sae] of inputs x [n, d_in], by the kind's inference rule."""
    w, kind = d["w"], d["ours"]["kind"]
    pre = (x - w["b_dec"] if d["cfg"]["apply_b_dec_to_input"] else x) @ w["W_enc"] + w["b_enc"]
    if kind == "topk":
        top = pre.topk(d["ours"]["k"], dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    if kind == "relu":
        return pre.relu()
    return pre * (pre > w["threshold"])  # jumprelu, batchtopk, matryoshka: a threshold at inference


def output(d: dict, x: torch.Tensor) -> torch.Tensor:
    """The reconstruction (SAE) or predicted MLP output (transcoder) of inputs x [n, d_in]."""
    w = d["w"]
    y = encode(d, x) @ w["W_dec"] + w["b_dec"]
    return y + x @ w["W_skip"].T if "W_skip" in w else y


@functools.lru_cache(maxsize=None)
def held_out_sources(data: str, story_fraction: float, val_fraction: float, seed: int) -> tuple[str, ...]:
    """Each source's held-out text of an English recipe (read once for the demos that share a corpus)."""
    recipe = Recipe(data=data, story_fraction=story_fraction, val_fraction=val_fraction, corpus_seed=seed)
    return tuple(recipe_corpus(recipe).val.values())


def held_out_text(name: str) -> str:
    recipe = Recipe.from_dict(json.loads((demo_dir() / name / "recipe.json").read_text()))
    if is_english(recipe.data):
        vals = held_out_sources(recipe.data, recipe.story_fraction, recipe.val_fraction, recipe.corpus_seed)
        skip = 500_000 // len(vals)  # past what experiments.ship measured on (20k + 400k chars)
        return "\n\n".join(v[skip:] if len(v) > skip + 20_000 else v[len(v) // 2:] for v in vals)
    return interp.held_out_stories(200_000, seed=STORY_SEED)


def windows(model, text: str, n_tokens: int) -> torch.Tensor:
    """[n, SEQ] token windows drawn evenly from the whole text's tokens."""
    rows = tuned_lens_windows(model, text, SEQ)
    return rows[torch.linspace(0, len(rows) - 1, min(len(rows), n_tokens // SEQ)).long()]


def hooks_of(d: dict) -> tuple[str, str]:
    """(the hook read, the hook replaced): the same for an SAE; ln2.hook_normalized -> hook_mlp_out for a transcoder."""
    if d["ours"]["transcoder"]:
        return d["cfg"]["hook_name"], act_name("mlp_out", d["ours"]["layer"])
    return d["cfg"]["hook_name"], d["cfg"]["hook_name"]


def ce(model, ids: torch.Tensor, hooks=()) -> float:
    logits = model.run_with_hooks(ids, fwd_hooks=list(hooks))
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), ids[:, 1:].flatten()).item()


def measure(model, d: dict, ids: torch.Tensor, clean_ce: float) -> dict:
    """EV, L0 and CE loss recovered with the dictionary spliced in (no error term) by plain hooks."""
    read, write = hooks_of(d)
    seen, sums = {}, dict(sse=0.0, sst=0.0, l0=0.0, n=0)

    def take(x, hook):
        seen["x"] = x
        return x

    def splice(y, hook):
        x = seen["x"].double().flatten(0, 1)
        out = output(d, x)
        target = y.double().flatten(0, 1)
        sums["sse"] += (target - out).pow(2).sum().item()
        sums["sst"] += (target - target.mean(0)).pow(2).sum().item()
        sums["l0"] += (encode(d, x) != 0).sum().item()
        sums["n"] += x.shape[0]
        return out.view(y.shape).to(y.dtype)

    def both(y, hook):
        return splice(take(y, hook), hook)

    with torch.inference_mode():
        spliced = ce(model, ids, [(read, take), (write, splice)] if read != write else [(write, both)])
        zero = ce(model, ids, [(write, lambda y, hook: torch.zeros_like(y))])
    return dict(ev=1 - sums["sse"] / sums["sst"], l0=sums["l0"] / sums["n"],
                ce_recovered=(zero - spliced) / (zero - clean_ce))


@torch.inference_mode()
def dead_fractions(model, dicts: list, ids: torch.Tensor) -> list[float]:
    hooks = sorted({d["cfg"]["hook_name"] for d in dicts})
    fired = [torch.zeros(d["cfg"]["d_sae"], dtype=torch.bool) for d in dicts]
    # whether a latent ever fires needs no float64: float32 halves the time of 40k tokens x every dictionary
    dicts = [{**d, "w": {k: v.float() for k, v in d["w"].items()}} for d in dicts]
    last = max(int(h.split(".")[1]) for h in hooks) + 1
    for start in range(0, len(ids), 64):
        _, cache = model.run_with_cache(ids[start:start + 64], names_filter=hooks, stop_at_layer=last)
        for d, f in zip(dicts, fired):
            f |= (encode(d, cache[d["cfg"]["hook_name"]].float().flatten(0, 1)) != 0).any(0)
    return [1 - f.double().mean().item() for f in fired]


@pytest.mark.parametrize("name", DEMOS)
def test_shipped_dictionaries_meet_the_targets_on_held_out_text(name):
    root = demo_dir() / name
    assert any((root / "saes").glob("*/cfg.json")), \
        f"{name} ships no dictionaries (sprout/demo/{name}/saes/): run python -m experiments.ship {name}"
    model = sprout.load(name).eval()
    dicts = dictionaries(root)
    n = int(model.cfg.n_layers)
    shipped = {d["folder"].name for d in dicts}
    # a residual SAE at every block and a transcoder for every MLP (the pipeline ships only those that meet
    # every target: `--keep-passing` would leave a gap here); each is measured below, none is assumed
    every = {act_name("resid_post", layer) for layer in range(n)} | {f"transcoder-{layer}" for layer in range(n)}
    assert shipped == every, f"missing: {sorted(every - shipped)}, unexpected: {sorted(shipped - every)}"
    text = held_out_text(name)
    ids = windows(model, text, DEAD_TOKENS)
    held = ids[torch.linspace(0, len(ids) - 1, HELD_TOKENS // SEQ).long()]
    with torch.inference_mode():
        clean = ce(model, held)
    misses = []
    for d, dead in zip(dicts, dead_fractions(model, dicts, ids)):
        tc = d["ours"]["transcoder"]
        found = interp.load_transcoder(model, d["ours"]["layer"]) if tc else interp.load_sae(model, d["cfg"]["hook_name"])
        assert torch.equal(found.W_dec.double(), d["w"]["W_dec"]), d["folder"]  # the loader finds these weights
        m = measure(model, d, held, clean)
        ev, ce_min = TARGETS[tc]
        if not (m["ev"] >= ev and m["ce_recovered"] >= ce_min and m["l0"] <= MAX_L0 and dead < MAX_DEAD):
            misses.append(f"{d['folder'].name}: EV {m['ev']:.3f} (>= {ev}), CE recovered {m['ce_recovered']:.3f} "
                          f"(>= {ce_min}), L0 {m['l0']:.1f} (<= {MAX_L0}), dead {dead:.1%} (< {MAX_DEAD:.0%})")
    assert not misses, f"{name}: on {held.numel()} / {ids.numel()} held-out tokens:\n" + "\n".join(misses)


def test_a_dictionary_for_other_weights_is_refused(tmp_path):
    """A dictionary stamped with another model's fingerprint is not found for this one and refused on load."""
    model = sprout.load("gpt-1").eval()
    sae = interp.SAE(int(model.cfg.d_model), 8, kind="topk", k=2, hook_name=act_name("resid_post", 0))
    sae.model_fingerprint = "0" * 16
    sae.save(shipped_folder(tmp_path, hook=sae.hook_name))
    with pytest.raises(FileNotFoundError, match="no shipped SAE"):
        interp.load_sae(model, sae.hook_name, root=tmp_path)
    with pytest.raises(ValueError, match="another model.*fingerprint"):
        interp.SAE.load(shipped_folder(tmp_path, hook=sae.hook_name), model=model)
