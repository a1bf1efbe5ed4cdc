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
from .common import add_text_file, folder_of, held_out_text, number, positive, standalone, text_file
from .feature_pages import dictionary_page, kind_text, metrics_text, model_page, score_text

NAME = "features"
DOC = "Feature pages for the shipped SAEs and transcoders: top contexts, activation histograms, logit effects."
SUMMARY = ("Sparse autoencoders on every block's residual stream and transcoders replacing every MLP (trained with "
           "interp.train_sae / train_transcoder, shipped by experiments.ship). The figures show, per model, every "
           "latent of one dictionary by density and mean activation; features/<model>.html links a page per "
           "dictionary with each shown latent's top-activating held-out contexts (tokens shaded by activation), "
           "its activation histogram and the tokens it promotes and suppresses.")
NEEDS_MODELS = True

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
            items.append(dict(label=label, file=page.name, kind=kind_text(sae), metrics=metrics_text(sae),
                              score=score_text(summary)))
            rows.append(number(f"interpretability score, {label} (dictionary / PCA / random)", score_text(summary),
                               None, model_label))
            if i == len(found) - 1:  # the index shows the last dictionary's overview
                out.figure(ff.feature_overview(rep.table, f"{model_label}: {label}", shown_label="described on its page"),
                           f"overview_{model_label}", f"{model_label}: every latent of the {label} by density and mean "
                           f"activation; features/{model_label}.html links a page per dictionary.")
        page_text = model_page(model_label, items, os.path.relpath(out.plotly_js(), out.dir).replace(os.sep, "/"))
        replace_file(out.dir / f"{model_label}.html", page_text.encode("utf-8"))
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

