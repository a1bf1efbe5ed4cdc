"""Cross-layer against per-layer transcoders at equal L0, on the shipped demos (issue 39 item 6):
`nice -n 10 python -m experiments.clt_compare [gpt-4 sprout-mini] [--steps N] [--threads 1] [--docs]`.

For each demo: the shipped per-layer transcoders without a skip (`interp.load_transcoder(model, l, skip=False)`:
BatchTopK at k per layer, written as JumpReLU) and the shipped cross-layer transcoder (`interp.load_clt`,
trained by `python -m experiments.ship NAME --only clt`: the recipe of `experiments.ship.CLT_PLANS`, the
per-layer transcoders' width, steps, batch, learning rate, seed and text, BatchTopK at k x n_layers latents per token
over all layers, the per-layer set's total). Where the shipped CLT is not of that recipe (or `--steps N` asks
for another count), one is trained here by the same code and kept in results/clt_compare/<demo>/clt/, reused
while its recorded recipe is the same. Both sets are then measured the same way: `interp.saes.clt_metrics` on
the demo's held-out text (EV per MLP output, L0 per token, CE recovered with every MLP replaced at once, against
zero and mean ablation), the dead fraction over the longer dead-fraction text (about 40k tokens, as the
shipping run counts it), and the attribution graphs of prompts cut from the held-out text
(`interp.attribute`, then `interp.graph_scores`: replacement and completeness of the full graph), with each
graph's L0 per token (active features / attributed positions) beside its scores.

Writes results/clt_compare/<demo>/ (metrics.csv, graphs.csv; clt/ when trained here) and, with --docs, the
"clt" block of docs/features.md.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pandas as pd
import torch

import interp
import sprout
from interp.saes.clt_metrics import clt_dead_fractions, clt_metrics, from_transcoders

from . import readme
from .ship import CLT_PLANS, ShipPlan, demo_texts
from .ship_clt import is_recipe, train

DEMOS = ("gpt-4", "sprout-mini")
N_PROMPTS, PROMPT_TOKENS = 8, 24
COMMAND = "nice -n 10 python -m experiments.clt_compare gpt-4 sprout-mini --threads 1 --docs"


def clt_of(name: str, model, texts: dict, steps: Optional[int], out: Path) -> interp.CrossLayerTranscoder:
    """The demo's CLT by its one recipe (`experiments.ship.CLT_PLANS`, `--steps` overriding its steps): the
    shipped one when that recipe trained it, else one trained here and kept in out/<name>/clt (reused while
    its recorded recipe is the same)."""
    plan = CLT_PLANS[name] if steps is None else replace(CLT_PLANS[name], steps=steps)
    try:
        shipped = interp.load_clt(model)
        if is_recipe(shipped, plan):
            return shipped
    except FileNotFoundError:
        pass
    folder = out / name / "clt"
    if (folder / "cfg.json").is_file():
        clt = interp.CrossLayerTranscoder.load(folder, model)
        if is_recipe(clt, plan):
            return clt
    print(f"{name}: the shipped CLT is not of the recipe {plan}: training one in {folder}")
    clt = train(model, plan, texts)
    clt.save(folder)
    return clt


def prompts(model, text: str) -> list[torch.Tensor]:
    """N_PROMPTS windows of PROMPT_TOKENS tokens, evenly spaced through the held-out text."""
    ids = model.to_tokens(text, prepend_bos=False)[0] if hasattr(model, "to_tokens") else None
    if ids is None:
        raise SystemExit("the model has no tokenizer")
    step = (len(ids) - PROMPT_TOKENS) // N_PROMPTS
    return [ids[i * step:i * step + PROMPT_TOKENS] for i in range(N_PROMPTS)]


def graph_rows(model, sets: dict, prompt_ids: list) -> pd.DataFrame:
    rows = []
    for i, ids in enumerate(prompt_ids):
        for kind, dicts in sets.items():
            g = interp.attribute(model, ids, dicts, batch_size=256)
            score = interp.graph_scores(g).iloc[0]
            rows.append({"prompt": i, "set": kind, "replacement": float(score["replacement"]),
                         "completeness": float(score["completeness"]), "n_features": g.n_features,
                         "l0_per_token": g.n_features / (g.n_pos - g.prefix), "seconds": g.info["seconds"]})
    return pd.DataFrame(rows)


def compare(name: str, steps: Optional[int], out: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    model = sprout.load(name)
    per_layer = [interp.load_transcoder(model, l, skip=False) for l in range(int(model.cfg.n_layers))]
    texts = demo_texts(name, ShipPlan(train_chars=CLT_PLANS[name].train_chars))
    clt = clt_of(name, model, texts, steps, out)
    sets = {"per-layer": from_transcoders(per_layer), "cross-layer": clt}
    metrics = pd.concat([clt_metrics(model, c, texts["held"]).assign(
        set=kind, dead_long=float(clt_dead_fractions(model, c, texts["dead"]).dead_fraction.iloc[-1])) for kind, c in sets.items()])
    graphs = graph_rows(model, {"per-layer": per_layer, "cross-layer": clt}, prompts(model, texts["held"]))
    (out / name).mkdir(parents=True, exist_ok=True)
    metrics.to_csv(out / name / "metrics.csv", index=False)
    graphs.to_csv(out / name / "graphs.csv", index=False)
    mixes = [(tc.info.get("recipe") or {}).get("train_mix", "shares") for tc in per_layer]
    return metrics, graphs, {"held": texts["held_desc"], "clt": clt.info, "per_layer": per_layer[0].info["settings"],
                             "per_layer_mixes": mixes, "per_layer_widths": [tc.d_sae for tc in per_layer]}


def markdown(results: dict) -> str:
    lines = [f"Generated by `{COMMAND}` (results/clt_compare/). Per-layer: the shipped transcoders without a skip; "
             "cross-layer: the shipped CLT (`python -m experiments.ship NAME --only clt`, the recipe of "
             "`experiments.ship_clt`: as many latents per layer as the set's recipe, its total k equal to the per-layer set's (k per layer "
             "x layers), same steps, batch, lr, seed and training text, but where an MLP's own recipe mixes the sources in "
             "equal shares (`ShipPlan.train_mix`), trained on one CPU core; each demo's recipe below). Graph "
             "columns: means over "
             f"{N_PROMPTS} prompts of {PROMPT_TOKENS} tokens cut from the held-out text (full, unpruned graphs; "
             "L0/token = active features / attributed positions). Metrics: `interp.saes.clt_metrics` on the held-out "
             "text, every MLP replaced at once (s.e.: over windows, a lower bound); dead: never firing over about 40k "
             "other held-out tokens (the shipping run's count).", "",
             "| model | set | L0/token (graphs) | replacement | completeness | L0/token (held-out) | EV (all MLPs) | "
             "EV per layer | CE rec. (zero) ± s.e. | CE rec. (mean) ± s.e. | dead |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (metrics, graphs, info) in results.items():
        for kind in ("per-layer", "cross-layer"):
            g = graphs[graphs.set == kind]
            m = metrics[metrics.set == kind]
            total = m[m.layer == "all"].iloc[0]
            per = " / ".join(f"{v:.2f}" for v in m[m.layer != "all"].explained_variance)
            lines.append(f"| {name} | {kind} | {g.l0_per_token.mean():.1f} | {g.replacement.mean():.3f} "
                         f"(min {g.replacement.min():.3f}) | {g.completeness.mean():.3f} | {total.l0:.1f} | "
                         f"{total.explained_variance:.3f} | {per} | {total.ce_loss_recovered:.3f} ± "
                         f"{total.ce_loss_recovered_se:.3f} | {total.ce_loss_recovered_mean:.3f} ± "
                         f"{total.ce_loss_recovered_mean_se:.3f} | {total.dead_long:.1%} |")
    lines.append("")
    for name, (_, _, info) in results.items():
        r, s = info["clt"].get("recipe", {}), info["clt"].get("settings", {})
        lines.append(f"- {name}'s CLT: {s.get('d_sae')} latents per layer, k {s.get('k')}, {r.get('steps')} steps of "
                     f"{r.get('batch_size')} tokens, AuxK weight {r.get('aux_k_coefficient'):.4g} over latents unfired "
                     f"for {r.get('dead_tokens'):,} tokens, the sources in {mix_words(r.get('train_mix', 'shares'))}; "
                     f"trained in {info['clt'].get('train_seconds', float('nan')):.0f} s (one process, shared 2-core "
                     f"machine). {per_layer_mixes(info['per_layer_mixes'])}"
                     f"{per_layer_widths(info['per_layer_widths'], s.get('d_sae'))}")
    return "\n".join(lines)


def mix_words(mix: str) -> str:
    return "equal shares" if mix == "equal" else "the training text's own shares"


def per_layer_mixes(mixes: list[str]) -> str:
    """Which MLPs of the per-layer set trained on which mix, in words."""
    equal = [str(l) for l, m in enumerate(mixes) if m == "equal"]
    if not equal:
        return "The per-layer set: the training text's own shares."
    if len(equal) == len(mixes):
        return "The per-layer set: equal shares."
    return f"The per-layer set: equal shares at MLP{'s' * (len(equal) > 1)} {', '.join(equal)}, the others the training text's own."


def per_layer_widths(widths: list[int], clt_width: Optional[int]) -> str:
    """The per-layer set's latents per MLP in words, where any MLP's differs from the CLT's ('' where none does)."""
    other = {w: [str(l) for l, v in enumerate(widths) if v == w] for w in sorted(set(widths)) if w != clt_width}
    if not other or clt_width is None:
        return ""
    return " Its width differs from the CLT's at " + "; ".join(
        f"MLP{'s' * (len(ls) > 1)} {', '.join(ls)}: {w} latents" for w, ls in other.items()) + \
        " (the shipped transcoders' own recipes)."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=list(DEMOS), choices=DEMOS)
    p.add_argument("--steps", type=int, default=None, help="train a CLT of this many steps instead of the recipe's")
    p.add_argument("--out", type=Path, default=Path("results/clt_compare"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--docs", action="store_true", help="write the table into docs/features.md (block 'clt')")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {name: compare(name, args.steps, args.out) for name in args.names}
    text = markdown(results)
    print(text)
    if args.docs:
        readme.rewrite(readme.home("clt", Path(__file__).resolve().parents[1]), "clt", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
