"""Feature pages: what the latents of each model's shipped SAEs and transcoders fire on and write.

Writes `features/<model>.html` (the dictionaries, their metrics and feature lists) and
`features/<model>/<dictionary>.html` (per shown latent: its top-activating contexts with each token
shaded by its activation, the histogram of its activations and its top and bottom logit effects), all
from `interp.saes.features.feature_report` on held-out text. A model without dictionaries (beside its
checkpoint or shipped for its weights) is listed and skipped.

    python -m experiments.features [--model gpt-4] [--chars 12000] [--show 12]
    python -m experiments.features --readme README.md     # the README's Features section (interventions)
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
from interp.saes.features import feature_report
from sprout.files import replace_file
from sprout.material import generate_story
from sprout.names import act_name
from sprout.tokenizer import raw

from . import readme as readme_file
from .common import folder_of, held_out_text, number, positive, standalone

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
.ctx span{padding:1px 0;border-radius:2px} .ctx span.peak{outline:1px solid #b00}
figure{margin:1em 0;overflow-x:auto} section.latent{border-top:1px solid #ccc;margin-top:1.5em}
"""


def add_args(p):
    p.add_argument("--chars", type=positive, default=12_000, help="characters of held-out text to read the latents on")
    p.add_argument("--show", type=positive, default=8, help="latents shown per dictionary")
    p.add_argument("--readme", default=None, metavar="README", help="rewrite the README's Features section and stop")


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


def shade(ctx) -> str:
    """One context as HTML: each token's background is its activation over the example's peak."""
    top = max(float(ctx.example_max.iloc[0]), 1e-9)
    spans = []
    for tok, act, off in zip(ctx.token_str, ctx.activation, ctx.offset):
        alpha = min(max(act / top, 0.0), 1.0)
        cls = " class=peak" if off == 0 else ""
        spans.append(f"<span{cls} style='background:rgba(214,39,40,{alpha:.2f})' title='{act:.3g}'>"
                     f"{html.escape(tok)}</span>")
    return f"<div class=ctx>{''.join(spans)}</div>"


def _page(title: str, body: list[str], js: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script src='{js}'></script></head><body><h1>{html.escape(title)}</h1>" + "\n".join(body) + "</body></html>")


def _fig(fig, div_id: str) -> str:
    return f"<figure>{fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=dict(responsive=False))}</figure>"


def dictionary_page(label: str, model_label: str, rep, js: str) -> str:
    t = rep.table
    shown = t[t.shown]
    body = [f"<p><a href='../{model_label}.html'>{html.escape(model_label)}</a> · {len(t)} latents, "
            f"{int((t.density > 0).sum())} fired on the held-out text.</p>", _fig(ff.feature_overview(t, label), "overview"),
            "<table><tr><th>latent</th><th>density</th><th>mean act.</th><th>summary</th></tr>"]
    body += [f"<tr><td><a href='#l{r.latent}'>{r.latent}</a></td><td class=num>{r.density:.2%}</td>"
             f"<td class=num>{r.mean_act:.3g}</td><td>{html.escape(r.summary)}</td></tr>" for r in shown.itertuples()]
    body.append("</table>")
    for r in shown.itertuples():
        ctx = rep.contexts[rep.contexts.latent == r.latent]
        body.append(f"<section class=latent id='l{r.latent}'><h2>latent {r.latent}</h2><p>density {r.density:.2%}, "
                    f"mean activation {r.mean_act:.3g}, max {r.max_act:.3g}. {html.escape(r.summary)}</p>")
        body += [shade(ex) for _, ex in ctx.groupby("example")]
        body.append(_fig(ff.feature_card(rep.histograms, rep.logit_effects, r.latent, f"latent {r.latent}"), f"card{r.latent}"))
        body.append("</section>")
    return _page(f"{model_label}: {label}", body, js)


def _metrics_cell(sae) -> str:
    held = (sae.info or {}).get("held_out") or {}
    keys = [("explained_variance", "EV {:.3f}"), ("ce_loss_recovered", "CE rec. {:.3f}"), ("l0", "L0 {:.1f}"),
            ("dead_fraction", "dead {:.1%}")]
    return ", ".join(f.format(held[k]) for k, f in keys if isinstance(held.get(k), (int, float)))


def run(models, out, args) -> list[dict]:
    rows = []
    for model_label, model in models.items():
        folder = folder_of(models, model_label)
        found = dictionaries(model, folder)
        if not found:
            rows.append(number("dictionaries", "none shipped or beside the checkpoint", None, model_label))
            continue
        (out.dir / model_label).mkdir(parents=True, exist_ok=True)
        js = os.path.relpath(out.plotly_js(), out.dir / model_label).replace(os.sep, "/")
        text = held_out_text(model, args.chars, folder=folder)
        items = []
        for i, (label, sae) in enumerate(found):
            rep = feature_report(model, sae, text, n_show=args.show)
            page = out.dir / model_label / f"{slug(label)}.html"
            replace_file(page, dictionary_page(label, model_label, rep, js).encode("utf-8"))  # old page or new, whole
            out.table(rep.table, f"{model_label}_{slug(label)}")
            items.append(f"<tr><td><a href='{model_label}/{page.name}'>{html.escape(label)}</a></td><td>{sae.kind}, "
                         f"d_sae {sae.d_sae}{f', k {sae.k}' if sae.k else ''}</td><td>{_metrics_cell(sae)}</td></tr>")
            if i == len(found) - 1:  # the index shows the last dictionary's overview
                out.figure(ff.feature_overview(rep.table, f"{model_label}: {label}"), f"overview_{model_label}",
                           f"{model_label}: every latent of the {label} by density and mean activation (features/"
                           f"{model_label}.html has a page per dictionary).")
        index = ["<p>Each dictionary's page shows its most frequent and most selective latents on held-out text.</p>",
                 "<table><tr><th>dictionary</th><th>kind</th><th>held-out metrics (shipped)</th></tr>", *items, "</table>"]
        replace_file(out.dir / f"{model_label}.html", _page(f"{model_label}: features", index,
                                                            os.path.relpath(out.plotly_js(), out.dir)).encode("utf-8"))
        rows.append(number("dictionaries with feature pages", len(found), None, model_label, fmt="{:d}"))
    return rows


# --- the README's Features section: three gpt-4 latents, each checked by clamping it ------------------

BLOCK = "features"  # the README block this section is written into (experiments.readme)
README_MODEL, N_STORIES, CLAMP_CHARS = "gpt-4", 60, 6_000


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
        for spans in interp.story_names(story).values():
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
    eff = interp_features.clamp_effect(model, sae, latent, text, k=10)
    up, down = eff[eff.direction == "top"], eff[eff.direction == "bottom"]
    return dict(value=float(eff.value.iloc[0]), promotes=", ".join(f"`{t!r}`" for t in up.token_str[:4]),
                suppresses=", ".join(f"`{t!r}`" for t in down.token_str[:4]),
                up=float(up.delta_logprob.mean()), down=float(down.delta_logprob.mean()),
                confirmed=bool(up.delta_logprob.mean() > 0 > down.delta_logprob.mean()))


def readme_section(model, root=None) -> str:
    """The Markdown between the README's features markers, computed from the shipped dictionaries (or those
    of `root`, a demo-like folder with saes/ in it)."""
    n = int(model.cfg.n_layers)
    text = interp.held_out_stories(CLAMP_CHARS, seed=interp.HELD_OUT_SEED + 2)
    rows, masks = name_pieces(model)
    tc = interp.load_transcoder(model, n - 1, root=root)
    sel = interp_features.latent_selectivity(model, tc, rows, masks)
    best = sel[sel.fire_on >= 0.3].iloc[0]
    picks = [(f"MLP {n - 1} transcoder", tc, int(best.latent),
              f"the later pieces of repeated invented names ({best.fire_on:.0%} of them; {best.fire_off:.1%} of other "
              f"tokens; {best.precision:.0%} of the tokens it fires on are such pieces)")]
    sae = interp.load_sae(model, act_name("resid_post", n - 1), root=root)
    for j, token in _token_latents(model, sae, text, 2):
        marks = [r == model.to_single_token(token) for r in rows] if _single(model, token) else []
        # the token may not occur in the name stories at all: then no selectivity to state
        sel = interp_features.latent_selectivity(model, sae, rows, marks) if any(m.any() for m in marks) else None
        on = "" if sel is None else (f" ({float(sel.set_index('latent').fire_on[j]):.0%} of them; "
                                     f"{float(sel.set_index('latent').fire_off[j]):.1%} of other tokens)")
        picks.append((f"resid_post {n - 1} SAE", sae, j, f"the token `{token!r}`{on}"))
    lines = ["| dictionary | latent | fires on | promotes (logit effect) | suppresses | clamped to | "
             "mean Δ log p, 10 most promoted / suppressed | as its logit effects say |", "|---|---|---|---|---|---|---|---|"]
    for label, d, j, fires in picks:
        c = _clamp_line(model, d, j, text)
        lines.append(f"| {label} | {j} | {fires} | {c['promotes']} | {c['suppresses']} | {c['value']:.2f} | "
                     f"{c['up']:+.2f} / {c['down']:+.2f} | {'yes' if c['confirmed'] else 'no'} |")
    return "\n".join(lines)


def _single(model, token: str) -> bool:
    try:
        model.to_single_token(token)
        return True
    except ValueError:
        return False


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

