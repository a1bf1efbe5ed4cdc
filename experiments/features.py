"""Feature pages: what the latents of each model's shipped SAEs and transcoders fire on and write.

Writes `features/<model>.html` (the dictionaries, their metrics and feature lists) and
`features/<model>/<dictionary>.html` (per shown latent: its top-activating contexts with each token
shaded by its activation, the histogram of its activations and its top and bottom logit effects), all
from `interp.saes.features.feature_report` on held-out text. A model without dictionaries (beside its
checkpoint or shipped for its weights) is listed and skipped.

    python -m experiments.features [--model gpt-4] [--chars 12000] [--show 12]
    python -m experiments.features --model runs/mine --text-file my_text.txt  # a run folder, one's own text
    python -m experiments.features --readme docs/guide/features.md  # the site's feature table (interventions)
"""
from __future__ import annotations

import html
import os
import random
import re
import sys

import torch

import figures.features as ff
import interp
import interp.saes.features as interp_features
import sprout
from interp.saes.describe import tokens_of
from interp.saes.features import feature_report
from interp.saes.score import interpretability_score, interpretability_summary
from sprout.files import replace_file
from sprout.material import generate_story, unseen_texts
from sprout.names import act_name
from sprout.tokenizer import raw

from . import readme as readme_file
from .common import add_text_file, figure_div, folder_of, held_out_text, number, positive, standalone, text_file
from .feature_text import token_label, whole_words

NAME = "features"
DOC = "Feature pages for the shipped SAEs and transcoders: top contexts, activation histograms, logit effects."
SUMMARY = ("Sparse autoencoders on every block's residual stream and transcoders replacing every MLP (trained with "
           "interp.train_sae / train_transcoder, shipped by experiments.ship). The figures show, per model, every "
           "latent of one dictionary by density and mean activation; features/<model>.html links a page per "
           "dictionary with each shown latent's top-activating held-out contexts (tokens shaded by activation), "
           "its activation histogram and the tokens it promotes and suppresses.")
NEEDS_MODELS = True

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1300px;padding:0 1em;color:#222}
h2{margin-top:2em;border-bottom:1px solid #ddd} table{border-collapse:collapse;margin:.8em 0}
td,th{border-bottom:1px solid #eee;padding:.2em .7em;text-align:left;vertical-align:top} td.num{font-family:monospace;text-align:right}
.ctx{font-family:monospace;white-space:pre-wrap;margin:.15em 0;line-height:1.7;overflow-wrap:anywhere}
.ctx span{padding:1px 0;border-radius:2px} .ctx span.peak{outline:1px solid #b00} p.defs{max-width:70em;color:#444}
figure{margin:1em 0;overflow-x:auto} section.latent{border-top:1px solid #ccc;margin-top:1.5em}
"""


def add_args(p):
    add_text_file(p)
    p.add_argument("--chars", type=positive, default=12_000, help="characters of held-out text to read the latents on")
    p.add_argument("--show", type=positive, default=8, help="latents shown per dictionary")
    p.add_argument("--score-latents", type=positive, default=48,
                   help="random latents (and PCA / random directions) described for each dictionary's interpretability score")
    p.add_argument("--readme", default=None, metavar="README", help="rewrite this file's features block (docs/guide/features.md), stop")


def dictionaries(model, folder=None) -> list:
    """(label, dictionary) for each residual SAE and transcoder found for this model (beside it in `folder`,
    else among the shipped ones), in block order."""
    roots = ([folder] if folder is not None else []) + [None]
    found = []
    for layer in range(int(model.cfg.n_layers)):
        for label, load in ((f"resid_post {layer}", lambda r: interp.load_sae(model, act_name("resid_post", layer), root=r)),
                            (f"MLP {layer} transcoder", lambda r: interp.load_transcoder(model, layer, root=r))):
            for root in roots:
                try:
                    found.append((label, load(root)))
                    break
                except FileNotFoundError:
                    continue
    return found


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def shade(ctx, model=None, rows=None) -> str:
    """One context as HTML, cut at whole words: each token's background is its activation over the example's
    peak; whitespace-only tokens and byte pieces are shown visibly (`feature_text.token_label`)."""
    ctx = whole_words(ctx)
    top = max(float(ctx.example_max.iloc[0]), 1e-9)
    spans = []
    for tok, act, off, row, pos in zip(ctx.token_str, ctx.activation, ctx.offset, ctx.row, ctx.pos):
        alpha = min(max(act / top, 0.0), 1.0)
        cls = " class=peak" if off == 0 else ""
        shown = token_label(model, int(rows[row][pos]), tok) if rows is not None else tok
        spans.append(f"<span{cls} style='background:rgba(214,39,40,{alpha:.2f})' title='{act:.3g}'>"
                     f"{html.escape(shown)}</span>")
    return f"<div class=ctx>{''.join(spans)}</div>"


DEFINITIONS = (
    "<p class=defs><b>EV</b> (explained variance): 1 − Σ‖x − x̂‖² / Σ‖x − mean x‖² over held-out tokens, x the "
    "activation an SAE reconstructs (a transcoder: the MLP's output). <b>CE rec.</b> (cross-entropy loss recovered): "
    "(CE ablated − CE spliced) / (CE ablated − CE clean), the dictionary spliced in without its error term, the "
    "activation ablated to zero (and, where given, to its mean). <b>L0</b>: latents firing per token. <b>dead</b>: "
    "latents firing on no held-out token. A latent's <b>description</b> is chosen on one held-out text (its tokens, "
    "token pairs, previous tokens or a token-class rule) and scored on another, with invented names the training "
    "text cannot hold: <b>precision</b> (of the tokens it matches, the share where the latent fires), <b>recall</b> "
    "(of the tokens where it fires, the share matched), <b>AUROC</b> (the description as a detector of where it "
    "fires), <b>fuzz</b> (the share of real and shuffled highlights of top contexts it tells apart; 0.5 is chance). "
    "The <b>interpretability score</b> is the share of latents with held-out AUROC ≥ 0.8, beside PCA directions and "
    "random directions of the same activations under the same procedure (<code>interp.interpretability_score</code>)."
    "</p>")


def visible_effects(model, effects):
    """Logit effects with each token label made visible (byte pieces as their bytes)."""
    return effects.assign(token_str=[token_label(model, t, s) for t, s in zip(effects.token, effects.token_str)])


def _page(title: str, body: list[str], js: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script src='{js}'></script></head><body><h1>{html.escape(title)}</h1>" + "\n".join(body) + "</body></html>")


def _fig(fig, div_id: str) -> str:
    return f"<figure>{figure_div(fig, div_id)}</figure>"


def _score_cells(r) -> str:
    if r is None:
        return "<td colspan=5></td>"
    return "".join(f"<td class=num>{v:.2f}</td>" for v in (r.precision, r.recall, r.auroc, r.fuzz)) + \
        f"<td>{html.escape(r.description)}</td>"


def dictionary_page(label: str, model_label: str, rep, js: str, scores=None, model=None, rows=None) -> str:
    """One dictionary's page: its shown latents ordered by held-out AUROC (`scores`: interpretability_score's
    rows for them), each with its contexts, histogram and logit effects."""
    t = rep.table
    held = {} if scores is None else {int(r.index): r for r in scores[scores.source == "dictionary"].itertuples()}
    shown = t[t.shown].assign(auroc=lambda f: [getattr(held.get(j), "auroc", float("nan")) for j in f.latent])
    shown = shown.sort_values("auroc", ascending=False, na_position="last")
    effects = visible_effects(model, rep.logit_effects) if model is not None else rep.logit_effects
    body = [f"<p>← <a href='../{model_label}.html'>{html.escape(model_label)}: every dictionary</a> · "
            f"<a href='../../index.html'>all results</a></p>", DEFINITIONS,
            f"<p>{len(t)} latents, {int((t.density > 0).sum())} fired on the held-out text; the latents below are "
            "ordered by the held-out AUROC of their description.</p>", _fig(ff.feature_overview(t, label), "overview"),
            "<table><tr><th>latent</th><th>density</th><th>precision</th><th>recall</th><th>AUROC</th><th>fuzz</th>"
            "<th>held-out description</th></tr>"]
    body += [f"<tr><td><a href='#l{r.latent}'>{r.latent}</a></td><td class=num>{r.density:.2%}</td>"
             f"{_score_cells(held.get(r.latent))}</tr>" for r in shown.itertuples()]
    body.append("</table>")
    for r in shown.itertuples():
        ctx = rep.contexts[rep.contexts.latent == r.latent]
        described = held.get(r.latent)
        line = "" if described is None else (f" Held out: {html.escape(described.description)} (AUROC {described.auroc:.2f}, "
                                             f"precision {described.precision:.2f}, recall {described.recall:.2f}).")
        body.append(f"<section class=latent id='l{r.latent}'><h2>latent {r.latent}</h2><p>density {r.density:.2%}, "
                    f"mean activation {r.mean_act:.3g}, max {r.max_act:.3g}. {html.escape(r.summary)}.{line}</p>")
        body += [shade(ex, model, rows) for _, ex in ctx.groupby("example")]
        body.append(_fig(ff.feature_card(rep.histograms, effects, r.latent, f"latent {r.latent}"), f"card{r.latent}"))
        body.append("</section>")
    return _page(f"{model_label}: {label}", body, js)


def _metrics_cell(sae) -> str:
    held = (sae.info or {}).get("held_out") or {}
    keys = [("explained_variance", "EV {:.3f}"), ("ev_margin", "({:+.3f} over the best baseline)"),
            ("ce_loss_recovered", "CE rec. {:.3f}"), ("ce_loss_recovered_mean", "CE rec. against mean ablation {:.3f}"),
            ("l0", "L0 {:.1f}"), ("dead_fraction", "dead {:.1%}")]
    return ", ".join(f.format(held[k]) for k, f in keys if isinstance(held.get(k), (int, float)))


def _score_cell(summary) -> str:
    """The interpretability score of a dictionary beside PCA and random directions (share with AUROC >= 0.8)."""
    share = dict(zip(summary.source, summary.share_good))
    return " / ".join(f"{share[k]:.0%}" if k in share else "–" for k in ("dictionary", "pca", "random"))


def _scores(model, sae, text: str, held: str, rep, n: int):
    """interpretability_score's rows for n random live latents and the shown ones, and the summary over
    the random sample (with n PCA and n random directions)."""
    live = rep.table.latent[rep.table.density > 0].tolist()
    sample = random.Random(0).sample(live, min(n, len(live)))
    shown = rep.table.latent[rep.table.shown].tolist()
    scores = interpretability_score(model, sae, text, held, n=n, latents=sample + [j for j in shown if j not in sample])
    sampled = (scores.source != "dictionary") | scores["index"].isin(sample)
    return scores, interpretability_summary(scores[sampled])


def run(models, out, args) -> list[dict]:
    rows = []
    own = text_file(getattr(args, "text_file", None))  # one's own contexts, read before any work
    held = "\n\n".join(unseen_texts(120, seed=38))  # names the generator cannot draw, in frames it never wrote
    for model_label, model in models.items():
        folder = folder_of(models, model_label)
        found = dictionaries(model, folder)
        if not found:
            rows.append(number("dictionaries", "none shipped or beside the checkpoint", None, model_label))
            continue
        (out.dir / model_label).mkdir(parents=True, exist_ok=True)
        js = os.path.relpath(out.plotly_js(), out.dir / model_label).replace(os.sep, "/")
        text = own or held_out_text(model, args.chars, folder=folder)
        windows = tokens_of(model, text)[1]  # the windows feature_report reads: contexts' (row, pos) index them
        items = []
        for i, (label, sae) in enumerate(found):
            rep = feature_report(model, sae, text, n_show=args.show, before=24, after=8)
            scores, summary = _scores(model, sae, text, held, rep, args.score_latents)
            page = out.dir / model_label / f"{slug(label)}.html"
            html_text = dictionary_page(label, model_label, rep, js, scores, model, windows)
            replace_file(page, html_text.encode("utf-8"))  # the old page or the new one, whole
            out.table(rep.table, f"{model_label}_{slug(label)}")
            out.table(scores, f"{model_label}_{slug(label)}_descriptions")
            items.append(f"<tr><td><a href='{model_label}/{page.name}'>{html.escape(label)}</a></td><td>{sae.kind}, "
                         f"d_sae {sae.d_sae}{f', k {sae.k}' if sae.k else ''}</td><td>{_metrics_cell(sae)}</td>"
                         f"<td class=num>{_score_cell(summary)}</td></tr>")
            rows.append(number(f"interpretability score, {label} (dictionary / PCA / random)", _score_cell(summary),
                               None, model_label))
            if i == len(found) - 1:  # the index shows the last dictionary's overview
                out.figure(ff.feature_overview(rep.table, f"{model_label}: {label}", shown_label="described on its page"),
                           f"overview_{model_label}", f"{model_label}: every latent of the {label} by density and mean "
                           f"activation; features/{model_label}.html links a page per dictionary.")
        index = ["<p>← <a href='../index.html'>all results</a></p>", DEFINITIONS,
                 "<p>Each dictionary's page shows its densest and most selective latents on held-out text, ordered by "
                 "the held-out AUROC of their descriptions.</p>",
                 "<table><tr><th>dictionary</th><th>kind</th><th>held-out metrics (shipped)</th>"
                 "<th>interpretability score: dictionary / PCA / random</th></tr>", *items, "</table>"]
        replace_file(out.dir / f"{model_label}.html", _page(f"{model_label}: features", index,
                                                            os.path.relpath(out.plotly_js(), out.dir)).encode("utf-8"))
        out.links.append((f"{model_label}.html", f"{model_label}: a page per dictionary"))
        rows.append(number("dictionaries with feature pages", len(found), None, model_label, fmt="{:d}"))
    return rows


# --- the README's Features section: three gpt-4 latents, each checked by clamping it ------------------

BLOCK = "features"  # the block this section is written into (its file: experiments.readme.HOMES)
README_MODEL, N_STORIES, CLAMP_CHARS = "gpt-4", 60, 6_000
N_BASELINES = 20  # random latents, and random unit directions, each latent's clamping is compared with


def name_pieces(model, n_stories: int = N_STORIES, seed: int = 1):
    """(rows, masks) of generated held-out stories: True on the later pieces (2nd token on) of a name's
    repeated occurrences, the tokens the chapter's induction circuit predicts."""
    tok = raw(model.tokenizer)
    rows, masks = [], []
    for i in range(n_stories):
        story = generate_story(random.Random(f"features-{seed}-{i}"))
        enc = tok.encode(story, add_special_tokens=False)
        n = min(len(enc.ids), int(model.cfg.n_ctx))
        mask = torch.zeros(n, dtype=torch.bool)
        for spans in interp.induction.story_names(story).values():
            for start, end in spans[1:]:
                toks = [t for t in range(n) if enc.offsets[t][0] < end and enc.offsets[t][1] > start]
                mask[toks[1:]] = True
        rows.append(torch.tensor(enc.ids[:n]))
        masks.append(mask)
    return rows, masks


def _token_latents(model, sae, text: str, n: int) -> list[tuple[int, str]]:
    """Latents whose top examples nearly all peak on one token (>= 80%), with that token, most selective first."""
    rep = feature_report(model, sae, text, n_show=60, n_examples=10)
    peaks = rep.contexts[rep.contexts.offset == 0]
    found, seen = [], set()
    for j, g in peaks.groupby("latent"):
        top, share = g.token_str.value_counts().index[0], g.token_str.value_counts(normalize=True).iloc[0]
        if share >= 0.8 and len(g) >= 8 and top.strip() and top not in seen:
            found.append((int(j), top))
            seen.add(top)
    return found[:n]


def _clamp_line(model, sae, latent: int, text: str) -> dict:
    """The latent clamped beside N_BASELINES random latents and as many random unit directions (same value,
    positions and error term): it "does what its logit effects say" only above their 95th percentile."""
    eff = interp_features.clamp_effect(model, sae, latent, text, k=10, baselines=N_BASELINES)
    up, down = eff[eff.direction == "top"], eff[eff.direction == "bottom"]
    first = eff.iloc[0]
    return dict(value=float(first.value), promotes=", ".join(f"`{t!r}`" for t in up.token_str[:4]),
                suppresses=", ".join(f"`{t!r}`" for t in down.token_str[:4]), agreement=float(first.agreement),
                p95=float(first.baseline_p95), confirmed=bool(first.beats_baselines),
                pass_rate=float(first.baseline_pass_rate))


def readme_section(model, root=None) -> str:
    """The Markdown between the README's features markers, computed from the shipped dictionaries (or those
    of `root`, a demo-like folder with saes/ in it). Each latent's claim is its description chosen on
    generated stories and scored on held-out texts whose names the generator cannot draw (`describe_latent`),
    and its clamping check is made against random latents and random directions (`clamp_effect`)."""
    n = int(model.cfg.n_layers)
    text = interp.held_out_stories(CLAMP_CHARS, seed=interp.data.HELD_OUT_SEED + 2)
    unseen = "\n\n".join(unseen_texts(120, seed=38))
    rows, masks = name_pieces(model)
    tc = interp.load_transcoder(model, n - 1, root=root)
    sel = interp_features.latent_selectivity(model, tc, rows, masks)
    picks = [(f"MLP {n - 1} transcoder", tc, int(sel[sel.fire_on >= 0.3].iloc[0].latent))]
    sae = interp.load_sae(model, act_name("resid_post", n - 1), root=root)
    picks += [(f"resid_post {n - 1} SAE", sae, j) for j, _ in _token_latents(model, sae, text, 2)]
    lines = ["| dictionary | latent | held-out description | precision / recall / AUROC | promotes (logit effect) | "
             "suppresses | clamped to | agreement: mean Δ log p, 10 promoted − 10 suppressed | 95th percentile of "
             f"{N_BASELINES} random latents and {N_BASELINES} random directions | does what its logit effects say |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, d, j in picks:
        h = interp.describe_latent(model, d, j, text, unseen).iloc[0]
        c = _clamp_line(model, d, j, text)
        lines.append(f"| {label} | {j} | {h.description} | {h.precision:.2f} / {h.recall:.2f} / {h.auroc:.2f} | "
                     f"{c['promotes']} | {c['suppresses']} | {c['value']:.2f} | {c['agreement']:+.2f} | {c['p95']:+.2f} | "
                     f"{'yes' if c['confirmed'] else 'no'} |")
    return "\n".join(lines)


def readme(path: str, threads: int = 1) -> int:
    torch.set_num_threads(threads)
    section = readme_section(sprout.load(README_MODEL).eval())
    print(section)
    readme_file.rewrite(path, BLOCK, section)
    print(f"rewrote the features section in {path}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--readme" in argv:
        return readme(argv[argv.index("--readme") + 1])
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())

