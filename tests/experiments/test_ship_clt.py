"""experiments.ship's `clt` step (experiments.ship_clt): the targets' wording, the recipe being the per-layer
transcoders' at their total k, a CLT written only when it meets its targets (or with --frontier, its misses
recorded) where `interp.load_clt` finds it, and clt_compare reusing the CLT of the one recipe."""
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

import interp
import sprout
from experiments import clt_compare, readme, ship, ship_clt, ship_targets
from interp._core.identity import model_config
from interp.saes.shipped import shipped_clt_folder

ROOT = Path(__file__).resolve().parents[2]
GOOD = dict(l0=40.0, dead_fraction=0.01, ce_loss_recovered_mean=0.93, explained_variance=0.91,
            per_layer_explained_variance=0.90)


@pytest.mark.parametrize("change, says", [
    (dict(l0=64.5), "L0 64.5 per token > 64 (n_layers x d_model / 12)"),
    (dict(dead_fraction=0.05), "dead fraction 5.0% >= 5%"),
    (dict(ce_loss_recovered_mean=0.899), "CE recovered (mean ablation, every MLP replaced) 0.899 < 0.9"),
    (dict(explained_variance=0.899), "explained variance 0.899 (all MLP outputs) < the per-layer set's 0.900"),
    (dict(per_layer_explained_variance=None), "explained variance not compared: no per-layer set without skip shipped"),
])
def test_clt_failures_name_each_missed_target(change, says):
    assert ship_targets.clt_failures(GOOD, 192, 4) == []
    assert ship_targets.clt_failures({**GOOD, **change}, 192, 4) == [says]


@pytest.mark.parametrize("name", sorted(ship.CLT_PLANS))
def test_the_clt_recipe_is_the_per_layer_transcoders_at_their_total_k(name):
    model = sprout.load(name)
    d, n = int(model.cfg.d_model), int(model.cfg.n_layers)
    per_layer, args = ship.SHIP_PLANS[name], ship.CLT_PLANS[name].train_args(model)
    assert args["k"] == n * ship_targets.default_k(d) <= n * ship_targets.max_l0(d)
    assert args["d_sae"] == round(per_layer.transcoder_width(False) * d)  # the per-layer set it is compared with
    assert {f: args[f] for f in ("batch_size", "lr", "seed")} == {f: getattr(per_layer, f) for f in ("batch_size", "lr", "seed")}
    assert ship.CLT_PLANS[name].train_chars == per_layer.train_chars
    assert ship.CLT_PLANS[name].steps == per_layer.transcoder_steps_of(False)  # trained as long as the set
    # on the text of the transcoders without a skip (their overrides aside: one text for every MLP)
    assert ship.CLT_PLANS[name].train_mix == per_layer.train_mix_of(False)


def test_a_recipe_from_before_train_mix_is_the_one_on_the_text_in_its_shares():
    plan = ship.CLT_PLANS["gpt-4"]
    old = {f: v for f, v in asdict(plan).items() if f != "train_mix"}
    clt = interp.CrossLayerTranscoder(2, 8, 4, kind="jumprelu")
    clt.info = {"recipe": old}
    assert plan.train_mix == "shares" and ship_clt.is_recipe(clt, plan)
    assert not ship_clt.is_recipe(clt, replace(plan, train_mix="equal"))
    clt.info = {"recipe": {**old, "train_mix": "equal"}}
    assert ship_clt.is_recipe(clt, replace(plan, train_mix="equal")) and not ship_clt.is_recipe(clt, plan)
    clt.info = {}
    assert not ship_clt.is_recipe(clt, plan)
    assert ship_clt.CltPlan.of(replace(ship.SHIP_PLANS["gpt-4"], train_mix="equal")).train_mix == "equal"


def fake_clt(model, seed=0) -> interp.CrossLayerTranscoder:
    n, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    clt = interp.CrossLayerTranscoder(n, d, 8, kind="jumprelu", seed=seed)
    clt.model_fingerprint, clt.model_config = interp.fingerprint(model), model_config(model)
    return clt


@pytest.fixture
def demos(tmp_path, monkeypatch):
    """A demo folder of gpt-1's weights in tmp_path, where the step writes and the loader looks."""
    monkeypatch.setattr(ship_clt, "demo_dir", lambda: tmp_path)
    monkeypatch.setattr(sprout.files, "demo_dir", lambda: tmp_path)
    (tmp_path / "gpt-1").mkdir()
    return tmp_path


def test_a_clt_is_written_only_when_it_meets_its_targets_or_as_the_frontier(demos, monkeypatch):
    model = sprout.load("gpt-1").eval()
    clt = fake_clt(model)
    texts = {"train": "abc", "train_desc": "the first {n} chars", "held_desc": "held-out", "held": "", "dead": ""}
    monkeypatch.setattr(ship_clt, "train", lambda model, plan, texts: clt)
    clt.info = {"train_seconds": 1.0}
    record = {**GOOD, "l0": 1e3, "explained_variance_per_layer": [0.9], "ce_loss_recovered": 0.95,
              "dead_tokens_measured": 40_000}
    monkeypatch.setattr(ship_clt, "measure", lambda model, c, texts: record)
    with pytest.raises(SystemExit, match=r"CLT not shipped, 1 target(?s:.)*L0 1000.0 per token"):
        ship_clt.ship_clt("gpt-1", model, ship_clt.CltPlan.of(ship.ShipPlan()), texts)
    assert not shipped_clt_folder(demos / "gpt-1").exists()
    with pytest.raises(FileNotFoundError, match="no shipped cross-layer transcoder"):
        interp.load_clt(model)
    folder = ship_clt.ship_clt("gpt-1", model, ship_clt.CltPlan.of(ship.ShipPlan()), texts, frontier=True)
    assert folder == demos / "gpt-1" / "saes" / "clt"
    held = json.loads((folder / "cfg.json").read_text())["metadata"]["sprout"]["info"]["held_out"]
    assert held["misses"] == [f"L0 1000.0 per token > {int(model.cfg.n_layers) * (int(model.cfg.d_model) // 12)} "
                              "(n_layers x d_model / 12)"] and held["data"] == "held-out"
    assert torch.equal(interp.load_clt(model).W_dec[0], clt.W_dec[0])
    with pytest.raises(FileNotFoundError, match="no shipped cross-layer transcoder"):
        interp.load_clt(sprout.load("gpt-4"))  # found by the weights' fingerprint, never by the folder alone


def test_clt_compare_takes_the_clt_of_the_one_recipe(tmp_path, monkeypatch):
    model = sprout.load("gpt-4").eval()
    plan = ship.CLT_PLANS["gpt-4"]
    shipped, trained = fake_clt(model, seed=1), fake_clt(model, seed=2)
    shipped.info = {"recipe": asdict(plan)}
    monkeypatch.setattr(interp, "load_clt", lambda m: shipped)
    calls = []
    monkeypatch.setattr(clt_compare, "train", lambda m, p, texts: calls.append(p) or trained)
    assert clt_compare.clt_of("gpt-4", model, {}, None, tmp_path) is shipped and calls == []
    trained.info = {"recipe": asdict(replace(plan, steps=7))}  # another step count: trained here, then reused
    got = clt_compare.clt_of("gpt-4", model, {}, 7, tmp_path)
    assert got is trained and calls == [replace(plan, steps=7)]
    again = clt_compare.clt_of("gpt-4", model, {}, 7, tmp_path)
    assert len(calls) == 1 and torch.equal(again.W_enc, trained.W_enc)


def test_remeasure_rewrites_the_record_and_keeps_the_weights(demos, monkeypatch):
    """Retraining the per-layer set leaves the CLT's comparison stale: remeasure rewrites the record only."""
    model = sprout.load("gpt-1").eval()
    texts = {"held_desc": "held-out", "held": "", "dead": ""}
    assert ship_clt.remeasure("gpt-1", model, texts) is None  # nothing shipped, nothing written
    assert not shipped_clt_folder(demos / "gpt-1").exists()
    clt = fake_clt(model)
    clt.info = {"train_seconds": 1.0, "recipe": {"steps": 3}}
    record = {**GOOD, "l0": 10.0, "explained_variance_per_layer": [0.9], "ce_loss_recovered": 0.95,
              "dead_tokens_measured": 40_000}
    monkeypatch.setattr(ship_clt, "measure", lambda model, c, texts: record)
    ship_clt.write("gpt-1", model, clt, texts, frontier=False)
    monkeypatch.setattr(ship_clt, "measure", lambda model, c, texts: {**record, "per_layer_explained_variance": 0.95})
    folder = ship_clt.remeasure("gpt-1", model, texts)  # the per-layer set now explains more: a miss, recorded
    info = json.loads((folder / "cfg.json").read_text())["metadata"]["sprout"]["info"]
    assert info["held_out"]["misses"] == ["explained variance 0.910 (all MLP outputs) < the per-layer set's 0.950"]
    assert info["held_out"]["per_layer_explained_variance"] == 0.95 and info["recipe"] == {"steps": 3}
    assert torch.equal(interp.load_clt(model).W_enc, clt.W_enc)


def test_the_docs_comparison_is_what_the_shipped_clt_records():
    """The clt block of docs/features.md and each CLT's cfg.json come from the same metrics on the same text: the
    block goes stale when the CLT or the per-layer set is retrained and the record re-measured."""
    text = readme.block(readme.read(readme.home("clt", ROOT)), "clt")
    for name in clt_compare.DEMOS:
        held = interp.load_clt(sprout.load(name)).info["held_out"]
        for kind, ev, ce in (("cross-layer", "explained_variance", "ce_loss_recovered_mean"),
                             ("per-layer", "per_layer_explained_variance", "per_layer_ce_loss_recovered_mean")):
            cells = [c.strip() for c in next(line for line in text.splitlines()
                                             if line.startswith(f"| {name} | {kind} |")).split("|")[1:-1]]
            assert cells[6] == f"{held[ev]:.3f}", (name, kind)
            assert cells[9].split(" ± ")[0] == f"{held[ce]:.3f}", (name, kind)


def test_the_docs_say_which_mlps_of_the_per_layer_set_trained_on_equal_shares():
    assert clt_compare.per_layer_mixes(["shares"] * 4) == "The per-layer set: the training text's own shares."
    assert clt_compare.per_layer_mixes(["equal"] * 2) == "The per-layer set: equal shares."
    assert clt_compare.per_layer_mixes(["shares", "equal", "equal", "shares"]) == \
        "The per-layer set: equal shares at MLPs 1, 2, the others the training text's own."
    assert clt_compare.per_layer_mixes(["equal", "shares"]).startswith("The per-layer set: equal shares at MLP 0,")
    assert clt_compare.per_layer_widths([256] * 3, 256) == ""
    assert clt_compare.per_layer_widths([256, 512, 256, 512, 1024], 256) == \
        " Its width differs from the CLT's at MLPs 1, 3: 512 latents; MLP 4: 1024 latents (the shipped transcoders' own " \
        "recipes)."
    assert clt_compare.per_layer_widths([256, 512], None) == ""
