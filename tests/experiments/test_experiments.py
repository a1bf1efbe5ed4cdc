"""run_all on a tiny random model saved like a training run: every file, and the numbers recomputed."""
import html
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

import interp
import sprout
from experiments import EXPERIMENTS
from experiments.common import SETTINGS, ZORBIN, Models, Output, held_out_text, model_dir
from experiments.run_all import run_all
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import train_bpe

CFG = SproutConfig(vocab_size=300, context=128, n_layer=2, n_head=2, d_model=32, d_ff=64)
LOG = pd.DataFrame(dict(step=[0, 10, 20], tokens=[0, 5120, 10240], lr=[0.0, 1e-3, 1e-4], train_loss=[5.8, 5.1, 4.6],
                        val_loss=[5.75, np.nan, 4.55], rep_first=[5.7, 5.2, 5.0], rep_second=[5.7, 4.0, 2.5],
                        elapsed_s=[0, 1, 2]))
OPTIONS = {"residual_growth": ["--chars", "3000"], "logit_lens": ["--chars", "2000"],
           "head_detection": ["--n-seqs", "4"], "induction_demo": ["--stories", "3"], "tuned_lens": ["--chars", "2000"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A training-run folder (train_log.csv, two snapshots) and run_all's output for its model."""
    root = tmp_path_factory.mktemp("exp")
    tok = train_bpe(generate_corpus(15_000, seed=3) + " Zorbin Plax", vocab_size=CFG.vocab_size)
    run_dir = root / "tiny"
    for step, seed in ((0, 1), (20, 0)):
        torch.manual_seed(seed)
        sprout.save(Sprout(CFG, tokenizer=tok), run_dir / "checkpoints" / f"step_{step:08d}")
    LOG.to_csv(run_dir / "train_log.csv", index=False)
    model = sprout.load(run_dir)
    # a tuned lens beside the latest checkpoint, as `python -m interp.lens.train` would leave it
    interp.train_tuned_lens(model, generate_corpus(3_000, seed=4), steps=2, batch_size=2, progress=False).save(
        run_dir / "checkpoints" / "step_00000020")
    out = root / "results"
    done = run_all(Models({"tiny": model}, {"tiny": run_dir}), out, progress=False, options=OPTIONS)
    return dict(out=out, done=done, model=model, run_dir=run_dir)


def plotly_pages(out):
    """The experiments' plotly figures as HTML (the graph pages of experiments.graphs draw their own SVG)."""
    return sorted(p for p in out.glob("*/*.html") if p.parent.name != "graphs")


def numbers(out, name):
    return {(r["model"], r["quantity"]): r for r in json.loads((out / name / "numbers.json").read_text())}


def test_every_file_is_written(run):
    out = run["out"]
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPERIMENTS + [".run_all", "index.html", "numbers.csv", "plotly.min.js"])
    expected = {
        "param_counts": {"param_table.csv", "param_breakdown.html"},
        "rope_check": {"chapter_pairs.csv", "sweep.csv", "rope_distance.html"},
        "residual_growth": {"residual_rms.csv", "residual_rms.html"},
        "logit_lens": {"lens_tiny.csv", "lens_tiny.html", "lens_summary.csv"},
        "tuned_lens": {"side_by_side_tiny.html", "curves_tiny.html", "comparison.csv", "comparison.md",
                       "comparison_repeated.csv", "comparison_repeated.md"},
        "head_detection": {"head_scores.csv", "ablation.csv", "scores_tiny.html", "ablation_tiny.html"},
        "attention_maps": {"patterns.csv", "grid_tiny_layer0.html", "grid_tiny_layer1.html",
                           "previous_token_tiny.html", "induction_tiny.html"},
        "induction_demo": {"induction_table.csv", "induction_table.html", "induction_stories.csv",
                           "induction_stories.html"},
        "training_dynamics": {"train_logs.csv", "loss_curves.html", "induction_snapshots_tiny.csv",
                              "induction_over_training_tiny.html"},
        "circuits": {"attribution_tiny.csv", "attribution_tiny.html", "circuit_tiny.csv", "circuit_tiny.txt",
                     "composition_k_tiny.csv", "composition_tiny.html", "dla_tiny.csv", "dla_tiny.html",
                     "phase_tiny.csv", "phase_tiny.html", "circuit_spread_tiny.csv"},
        "graphs": {"circuit_planted_induction.html", "circuit_tiny_induction.html"},
    }
    for name, files in expected.items():
        assert {p.name for p in (out / name).iterdir()} == files | {"numbers.json"}, name
    # plotly.js once, at the root; every figure points at it and holds one plot
    htmls = plotly_pages(out)
    assert len(htmls) == sum(len([f for f in fs if f.endswith(".html")]) for n, fs in expected.items() if n != "graphs")
    for h in htmls:
        text = h.read_text()
        assert re.search(r"<script[^>]* src=\"../plotly.min.js\"", text) and text.count("Plotly.newPlot") == 1, h
    assert len(list(out.rglob("plotly.min.js"))) == 1
    assert (out / "plotly.min.js").stat().st_size > 1_000_000


def test_index_shows_every_figure_with_its_sentence_and_the_chapter_numbers(run):
    index = (run["out"] / "index.html").read_text()
    n_figures = len(plotly_pages(run["out"]))
    assert index.count("Plotly.newPlot") == n_figures and index.count("<figure>") == n_figures
    assert index.count("<script src='plotly.min.js'>") == 1
    assert "<a href='graphs/circuit_planted_induction.html'>" in index  # the graph pages are linked
    for module, _, _ in run["done"].values():
        assert module.SUMMARY in html.unescape(index)  # escaped as Jinja2 escapes (&#39;), or as html.escape
    for chapter in ["17,309,056", "20.45M", "80%", "18%"]:
        assert chapter in index
    table = pd.read_csv(run["out"] / "numbers.csv")
    assert set(table["experiment"]) == set(EXPERIMENTS)


def test_param_numbers_match_a_built_model(run):
    n = numbers(run["out"], "param_counts")
    assert n["", "Sprout parameters"]["measured"] == Sprout(SproutConfig.preset("sprout")).num_params() == 17_309_056
    gpt1 = SproutConfig.preset("gpt-1")
    share = gpt1.vocab_size * gpt1.d_model / Sprout(gpt1).num_params()
    assert n["", "embedding share, gpt-1 preset"]["measured"] == pytest.approx(share)  # 78% (the chapter: 80%)
    assert n["", "embedding share, Sprout"]["shown"] == "18%"
    table = pd.read_csv(run["out"] / "param_counts" / "param_table.csv")
    assert int(table[(table.config == "tiny") & (table.part == "total")]["count"].iloc[0]) == run["model"].num_params()


def test_residual_numbers_match_the_embedding_rows(run):
    model, n = run["model"], numbers(run["out"], "residual_growth")
    ids = torch.tensor(model.tokenizer.encode(held_out_text(model, 3000), add_special_tokens=False).ids)
    with torch.no_grad():
        expected = model.embed.weight[ids].pow(2).mean(-1).sqrt().mean().item()
    assert n["tiny", "RMS after the embedding"]["measured"] == pytest.approx(expected, rel=1e-4)
    df = pd.read_csv(run["out"] / "residual_growth" / "residual_rms.csv").set_index("site")
    last = df.loc["blocks.1.hook_resid_post", "mean"]
    assert n["tiny", "RMS after block 2 (the last)"]["measured"] == pytest.approx(last)
    assert n["tiny", "growth, last block / embedding"]["measured"] == pytest.approx(last / expected, rel=1e-4)


def test_lens_output_row_is_the_models_prediction(run):
    model = run["model"]
    lens = pd.read_csv(run["out"] / "logit_lens" / "lens_tiny.csv")
    text = "".join(lens[lens.layer == 0].sort_values("pos").token.astype(str))
    with torch.no_grad():
        probs = torch.softmax(model(model.to_tokens(text), return_type="logits")[0].double(), -1)
    top = lens[lens.layer == 2].sort_values("pos").top_probs.map(lambda s: float(re.findall(r"[\d.e-]+", s)[0]))
    np.testing.assert_allclose(top.to_numpy(), probs.max(-1).values.numpy(), rtol=1e-4)


def test_own_models_lens_numbers_have_no_chapter_column(run):
    """The chapter's 77% / 59% are the 8-block Sprout's: a 2-block run of one's own is not compared with them."""
    n = numbers(run["out"], "logit_lens")
    rows = [r for (m, q), r in n.items() if m == "tiny" and q.startswith("mean top-1 probability")]
    assert len(rows) == 2 and all(r["chapter"] is None for r in rows)


def test_head_numbers_match_the_tables(run):
    n = numbers(run["out"], "head_detection")
    scores = pd.read_csv(run["out"] / "head_detection" / "head_scores.csv")
    ind = scores[scores.kind == "induction"].sort_values("score", ascending=False).iloc[0]
    assert n["tiny", "top induction head (score)"]["measured"] == f"L{ind.layer}H{ind['head']} ({ind.score:.2f})"
    abl = pd.read_csv(run["out"] / "head_detection" / "ablation.csv")
    np.testing.assert_allclose(abl.delta, abl.loss_ablated - abl.loss_clean)
    assert set(abl.method) == {"zero", "mean"} and abl.label.str.contains(r"\+").sum() == 2


def test_induction_numbers_are_the_models_probabilities(run):
    model, n = run["model"], numbers(run["out"], "induction_demo")
    table = pd.read_csv(run["out"] / "induction_demo" / "induction_table.csv")
    ids = model.tokenizer.encode(ZORBIN, add_special_tokens=False).ids
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([ids]), return_type="logits")[0].double(), -1)
    second = table[table.occurrence == 2].set_index("token_index")
    for i in (1, 2):
        pos, tok = int(second.loc[i, "pos"]), second.loc[i, "token"]
        got = n["tiny", f'p({tok!r}) at the 2nd "Zorbin Plax"']["measured"]
        assert got == pytest.approx(probs[pos - 1, ids[pos]].item(), rel=1e-4)


def test_rope_and_training_numbers(run):
    rope = numbers(run["out"], "rope_check")
    assert rope["", "largest spread of the score at a fixed distance"]["measured"] < 1e-3
    train = numbers(run["out"], "training_dynamics")
    assert train["tiny", "final held-out loss in train_log.csv (nats/token)"]["measured"] == 4.55
    model = run["model"]
    ids = torch.tensor(model.tokenizer.encode(held_out_text(model, SETTINGS.held_out_chars), add_special_tokens=False).ids)
    with torch.no_grad():  # independent: consecutive windows of the context, each predicting its own tokens 2..T
        windows = [w for w in (ids[i:i + CFG.context] for i in range(0, len(ids), CFG.context)) if len(w) > 1]
        losses = [model(w[None, :-1], return_type="loss", targets=w[None, 1:]).item() * (len(w) - 1) for w in windows]
    expected = sum(losses) / sum(len(w) - 1 for w in windows)
    got = train["tiny", "held-out loss on fresh stories (nats/token), measured here"]["measured"]
    assert got == pytest.approx(expected, rel=1e-5)
    snaps = pd.read_csv(run["out"] / "training_dynamics" / "induction_snapshots_tiny.csv")
    assert sorted(snaps.tokens.unique()) == [0, 10240] and len(snaps) == 2 * CFG.n_layer * CFG.n_head


def test_circuit_numbers_are_recomputed_from_the_snapshots(run):
    import interp

    phase = pd.read_csv(run["out"] / "circuits" / "phase_tiny.csv")
    assert sorted(phase["tokens"].unique()) == [0, 10240]  # both snapshots, at the tokens of train_log.csv
    last = sprout.load(run["run_dir"] / "checkpoints" / "step_00000020")
    measured = phase[phase["tokens"] == 10240].set_index("measure")["value"]
    ind = interp.head_scores(last, "induction").iloc[0].score
    assert measured["induction score"] == pytest.approx(ind, abs=1e-6)
    dla = pd.read_csv(run["out"] / "circuits" / "dla_tiny.csv")
    ids = torch.tensor(dla[dla.component == "embed"]["token"].to_numpy().copy())
    logits = run["model"].run_with_hooks(ids[None])[0]
    total = dla.groupby("pos")["attribution"].sum()
    targets = dla[dla.component == "embed"]["target"].to_numpy().copy()
    assert total.to_numpy() == pytest.approx(logits[np.arange(len(ids)), targets].detach().numpy(), abs=1e-3)


def test_standalone_script_writes_its_own_plotly(tmp_path, run, capsys):
    from experiments import rope_check

    assert rope_check.main(["--out", str(tmp_path / "rope")]) == 0
    assert {p.name for p in (tmp_path / "rope").iterdir()} == {
        ".run_all", "plotly.min.js", "rope_distance.html", "chapter_pairs.csv", "sweep.csv", "numbers.json"}
    assert re.search(r"<script[^>]* src=\"plotly.min.js\"", (tmp_path / "rope" / "rope_distance.html").read_text())
    assert "largest spread" in capsys.readouterr().out


def test_output_writes_only_its_folder_and_the_shared_js(tmp_path):
    """Figures land in their own folder; an experiment never writes outside it."""
    import figures

    o = Output(tmp_path / "a" / "exp", "exp", js_dir=tmp_path / "a")
    o.figure(figures.loss_curves(LOG), "curves", "caption")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "a/exp/curves.html", "a/plotly.min.js"]


def test_training_dynamics_reads_a_shipped_snapshot_table(run, tmp_path):
    """A demo folder ships train_log.csv and induction_snapshots.csv, not the snapshots themselves."""
    from experiments import training_dynamics
    from experiments.common import args_for
    from experiments.stamps import stamp_tables

    shipped = tmp_path / "demo"
    sprout.save(run["model"], shipped)
    LOG.to_csv(shipped / "train_log.csv", index=False)
    snaps = pd.read_csv(run["out"] / "training_dynamics" / "induction_snapshots_tiny.csv")
    snaps.to_csv(shipped / "induction_snapshots.csv", index=False)
    model = sprout.load(shipped)
    stamp_tables(shipped, ["induction_snapshots.csv"], model)
    out = Output(tmp_path / "out", "training_dynamics")
    training_dynamics.run(Models({"demo": model}, {"demo": shipped}), out, args_for(training_dynamics, ["--chars", "2000"]))
    assert [f.stem for f in out.figures] == ["loss_curves", "induction_over_training_demo"]
    pd.testing.assert_frame_equal(pd.read_csv(out.dir / "induction_snapshots_demo.csv"), snaps)


def test_run_all_runs_unchanged_on_a_tiny_walkthrough_gpt(tmp_path):
    """The same experiments, through the same hook names, on the walkthrough's character GPT."""
    from sprout.tokenizer import char_tokenizer
    from sprout.walkthrough import build_step

    text = generate_corpus(20_000, seed=4) + " Zorbin Plax"
    tok = char_tokenizer(text)
    torch.manual_seed(0)
    model = build_step("4.10", tokenizer=tok, context=128, d_model=32, n_head=2, n_layer=2)
    sprout.save(model, tmp_path / "walk")
    model = sprout.load(tmp_path / "walk")
    done = run_all(Models({"walk": model}, {"walk": tmp_path / "walk"}), tmp_path / "results", progress=False, options=OPTIONS)
    assert set(done) == set(EXPERIMENTS)
    lens = pd.read_csv(tmp_path / "results" / "logit_lens" / "lens_walk.csv")
    assert sorted(lens["layer"].unique()) == [0, 1, 2]
    scores = pd.read_csv(tmp_path / "results" / "head_detection" / "head_scores.csv")
    assert len(scores[scores["kind"] == "induction"]) == 2 * 2  # every (layer, head)
    assert (tmp_path / "results" / "index.html").read_text().count("Plotly.newPlot") == len(
        plotly_pages(tmp_path / "results"))


def test_tuned_lens_numbers_are_the_comparison_of_the_lens_beside_the_checkpoint(run):
    model = run["model"]
    lens = interp.load_tuned_lens(model, run["run_dir"])
    got = pd.read_csv(run["out"] / "tuned_lens" / "comparison.csv")
    want = interp.lens_comparison(model, held_out_text(model, 2000, run["run_dir"]), lens, by_seq=True)
    assert np.allclose(got.kl_to_final, want.kl_to_final) and np.allclose(got.cross_entropy, want.cross_entropy)
    rows = numbers(run["out"], "tuned_lens")
    tuned0 = want[(want.lens == "tuned") & (want.layer == 0)].groupby("layer").kl_to_final.mean().iloc[0]
    assert rows[("tiny", "held-out KL to the output, embedding, tuned lens (nats)")]["measured"] == pytest.approx(tuned0)


def test_a_demo_without_snapshots_draws_its_shipped_phase_table(tmp_path):
    from argparse import Namespace

    from experiments import circuits

    model = sprout.load("gpt-4")
    out = Output(tmp_path, "circuits")
    rows = circuits._phase(Models({"gpt-4": model}, {"gpt-4": model_dir("gpt-4")}), out, Namespace(max_snapshots=6))
    shipped = pd.read_csv(sprout.files.checkpoint.demo_dir() / "gpt-4" / circuits.SHIPPED_PHASE)
    written = pd.read_csv(tmp_path / "phase_gpt-4.csv")
    pd.testing.assert_frame_equal(written, shipped)
    assert set(shipped["measure"]) >= {"previous-token score", "induction score", "K-composition (x random)",
                                       "in-context score (late - early loss)", "K-composition percentile"}
    assert any(m.startswith("control ") for m in shipped["measure"])  # the control pairs beside the circuit's
    assert shipped["heads"].nunique() == 1  # one circuit followed through every snapshot
    assert [f.stem for f in out.figures] == ["phase_gpt-4"] and circuits.PHASE_SOURCE in out.figures[0].caption
    assert rows[0]["measured"] == shipped["tokens"].nunique()


def test_the_circuits_pages_phase_numbers_are_the_shipped_tables():
    from pathlib import Path

    from experiments import circuits

    table = pd.read_csv(sprout.files.checkpoint.demo_dir() / "gpt-4" / circuits.SHIPPED_PHASE)
    readme = " ".join((Path(__file__).resolve().parents[2] / "docs/guide/circuits.md").read_text().split())
    for measure in ("induction score", "previous-token score"):  # the page states interp.phase_change's stretch
        change = interp.phase_change(table, measure)
        assert f"from {change['start_value']:.2f} to {change['end_value']:.2f}" in readme, measure
    assert table["heads"].iloc[0].replace(" ", "") in readme.replace(" ", "")
