"""The dictionaries shipped under sprout/demo/*/saes/ meet their targets on held-out text they were not
trained on, recomputed from the files by code of its own: the weights read with safetensors, encode and
decode written out here, the splice made with plain TransformerLens hooks, and (issue 38) the baselines a
dictionary must beat computed here too: a PCA code from an SVD, least-squares regression from
torch.linalg.lstsq, the MLP's top neurons from the model's own W_out (nothing of interp.saes runs, except
to check that its loader finds each dictionary for these weights).

Two generations: the TopK dictionaries at L0 32 of issue 25 (absolute EV / CE targets), and those of
issue 38 (L0 <= d_model / 12, 8x residual SAEs, transcoders with and without skip, margins over the
baselines). Each test skips, naming why, on the other generation.

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
# issue 38: L0 <= d_model / 12; residual SAEs of >= 8 d_model latents beat the PCA code by 0.05 EV and 0.03 CE
# recovered (mean ablation); transcoders beat regression and top neurons by 0.10 EV, CE recovered (mean) >= 0.90
SAE_MARGINS, TC_EV_MARGIN, TC_CE_MEAN, EXPANSION = (0.05, 0.03), 0.10, 0.90, 8
FIT_TOKENS = 16_384  # held-out tokens (other than the measured ones) the baselines are fitted on
STORY_SEED = 777_001  # held-out stories no training or shipping run reads
DEMOS = ("gpt-4", "sprout-mini")  # the demos with a dictionary recipe (experiments/ship.py)


def dictionaries(root: Path) -> list[dict]:
    """Every per-layer dictionary folder under root/saes/, read by hand: cfg.json and the safetensors weights
    (the cross-layer transcoder in saes/clt/ is tested in test_shipped_clt.py)."""
    out = []
    for folder in sorted(f for f in (root / "saes").glob("*/") if f.name != "clt"):
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
    if not predates_issue_38(dicts, int(model.cfg.d_model)):
        pytest.skip(f"{name}: issue 25's targets (L0 32) are superseded by issue 38's margins "
                    "(test_shipped_dictionaries_beat_their_baselines)")
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


# --- issue 38: sparse dictionaries that beat the codes anyone could write down without training -----------

def predates_issue_38(dicts: list, d_model: int) -> list[str]:
    """Why the shipped set cannot meet issue 38's targets as it stands ([] when it is of that generation)."""
    why = [f"{d['folder'].name}: k {d['ours']['k']} > d_model / 12" for d in dicts
           if d["ours"].get("k") and d["ours"]["k"] > d_model // 12]
    why += [f"{d['folder'].name}: {d['cfg']['d_sae']} latents < {EXPANSION} d_model" for d in dicts
            if not d["ours"]["transcoder"] and d["cfg"]["d_sae"] < EXPANSION * d_model]
    if not any(d["folder"].name.endswith("-noskip") for d in dicts):
        why.append("no transcoder without skip (transcoder-<l>-noskip)")
    return why


def keep_top(score: torch.Tensor, l0: torch.Tensor) -> torch.Tensor:
    """A mask [n, m] of each row's l0[row] largest entries of score [n, m]."""
    rank = score.argsort(-1, descending=True).argsort(-1)
    return rank < l0[:, None]


def baseline_outputs(d: dict, fit: dict, cache: dict, l0: torch.Tensor, model) -> dict:
    """{baseline: output [n, d]} on the measured tokens: the PCA code (SVD of the fit activations) for an SAE;
    least squares and the top neurons (|h_i| ||W_out[i]||, the model's W_out) for a transcoder."""
    read, write = hooks_of(d)
    x = cache[read].double().flatten(0, 1)
    if not d["ours"]["transcoder"]:
        mean = fit[read].mean(0)
        basis = torch.linalg.svd(fit[read] - mean, full_matrices=False)[2].T
        coef = (x - mean) @ basis
        return {"pca": (coef * keep_top(coef.abs(), l0)) @ basis.T + mean}
    x_fit = torch.cat([fit[read], torch.ones(len(fit[read]), 1, dtype=torch.float64)], 1)
    w = torch.linalg.lstsq(x_fit, fit[write]).solution
    layer = d["ours"]["layer"]
    h = cache[act_name("mlp_post", layer)].double().flatten(0, 1)
    W_out = model.W_out[layer].detach().double()
    kept = keep_top(h.abs() * W_out.norm(dim=-1), l0)
    return {"regression": x @ w[:-1] + w[-1], "top_neurons": (h * kept) @ W_out}


def measure_against_baselines(model, d: dict, ids: torch.Tensor, fit: dict, clean_ce: float) -> dict:
    """EV, L0 and CE recovered (zero and mean ablation) of the dictionary and of each baseline, all on ids."""
    read, write = hooks_of(d)
    names = list({read, write, act_name("mlp_post", d["ours"].get("layer") or 0)})
    with torch.inference_mode():
        _, cache = model.run_with_cache(ids, names_filter=names)
        x, y = cache[read].double().flatten(0, 1), cache[write].double().flatten(0, 1)
        l0 = (encode(d, x) != 0).sum(-1)
        outs = {"dictionary": output(d, x), **baseline_outputs(d, fit, cache, l0, model)}

        def put(values):
            return lambda a, hook: values.reshape(a.shape).to(a.dtype)

        zero = ce(model, ids, [(write, lambda a, hook: torch.zeros_like(a))])
        mean = ce(model, ids, [(write, put(fit[write].mean(0).expand(len(y), -1)))])
        sst = (y - y.mean(0)).pow(2).sum().item()
        out = dict(l0=l0.double().mean().item())
        for name, o in outs.items():
            spliced = ce(model, ids, [(write, put(o))])
            out[name] = dict(ev=1 - (y - o).pow(2).sum().item() / sst, ce_zero=(zero - spliced) / (zero - clean_ce),
                             ce_mean=(mean - spliced) / (mean - clean_ce))
    return out


def misses_of(d: dict, m: dict, dead: float, d_model: int) -> list[str]:
    own, base = m["dictionary"], {k: v for k, v in m.items() if k not in ("dictionary", "l0")}
    ev_margin = own["ev"] - max(b["ev"] for b in base.values())
    checks = [(m["l0"] <= d_model // 12, f"L0 {m['l0']:.1f} > {d_model // 12}"), (dead < MAX_DEAD, f"dead {dead:.1%}")]
    if d["ours"]["transcoder"]:
        checks += [(ev_margin >= TC_EV_MARGIN, f"EV margin {ev_margin:+.3f} over regression / top neurons"),
                   (own["ce_mean"] >= TC_CE_MEAN, f"CE recovered (mean ablation) {own['ce_mean']:.3f}")]
    else:
        ce_margin = own["ce_mean"] - base["pca"]["ce_mean"]
        checks += [(ev_margin >= SAE_MARGINS[0], f"EV margin {ev_margin:+.3f} over the PCA code"),
                   (ce_margin >= SAE_MARGINS[1], f"CE recovered (mean ablation) margin {ce_margin:+.3f} over the PCA code")]
    return [f"{d['folder'].name}: {why}" for ok, why in checks if not ok]


TARGET_WORDS = {"L0": ("L0",), "dead": ("dead",), "EV": ("EV margin", "explained variance"), "CE": ("CE recovered",)}


def target_of(miss: str) -> str:
    """Which target a miss (the shipping run's words or this test's) is about: L0, dead, EV or CE."""
    return next(t for t, words in TARGET_WORDS.items() if any(w in miss for w in words))


def declared_misses(d: dict) -> set[str]:
    """The targets a dictionary's own cfg.json says it missed when shipped (held_out.misses: empty or absent
    when it claims to meet them all); every other target is a claim the test below checks."""
    return {target_of(m) for m in d["ours"]["info"].get("held_out", {}).get("misses") or []}


@pytest.mark.parametrize("name", DEMOS)
def test_shipped_dictionaries_beat_their_baselines(name):
    root = demo_dir() / name
    model = sprout.load(name).eval()
    dicts = dictionaries(root)
    d_model, n = int(model.cfg.d_model), int(model.cfg.n_layers)
    old = predates_issue_38(dicts, d_model)
    if old:
        pytest.skip(f"{name}: the shipped dictionaries predate issue 38's retrain (python -m experiments.ship {name} "
                    f"--only saes, after the demos are retrained): " + "; ".join(old[:3]))
    every = {act_name("resid_post", layer) for layer in range(n)}
    every |= {f"transcoder-{layer}{tail}" for layer in range(n) for tail in ("", "-noskip")}
    assert {d["folder"].name for d in dicts} == every
    ids = windows(model, held_out_text(name), DEAD_TOKENS)
    held = ids[torch.linspace(0, len(ids) - 1, HELD_TOKENS // SEQ).long()]
    rest = ids[torch.isin(torch.arange(len(ids)), torch.linspace(0, len(ids) - 1, HELD_TOKENS // SEQ).long(), invert=True)]
    fit_ids = rest[:FIT_TOKENS // SEQ]
    hooks = sorted({h for d in dicts for h in hooks_of(d)})
    with torch.inference_mode():
        clean = ce(model, held)
        _, cache = model.run_with_cache(fit_ids, names_filter=hooks)
    fit = {h: cache[h].double().flatten(0, 1) for h in hooks}
    misses = []
    for d, dead in zip(dicts, dead_fractions(model, dicts, ids)):
        found = misses_of(d, measure_against_baselines(model, d, held, fit, clean), dead, d_model)
        # a frontier dictionary (experiments.ship --frontier) declares what it misses: the rest is checked
        misses += [m for m in found if target_of(m.split(": ", 1)[1]) not in declared_misses(d)]
    assert not misses, f"{name}: on {held.numel()} held-out tokens (baselines fitted on {fit_ids.numel()} others):\n" + \
        "\n".join(misses)
