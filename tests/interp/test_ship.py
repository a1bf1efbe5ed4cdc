"""experiments.ship's checks: the targets' wording, the dead fraction counted over many tokens in one
forward (equal to interp.sae_metrics' count on the same tokens), the held-out share of several texts,
and the recipes' dictionaries fitting the size budget."""
import json

import pytest
import torch

import interp
import sprout
from experiments import ship
from interp import stream_windows as windows
from sprout.files import demo_dir
from sprout.names import act_name

GOOD = dict(explained_variance=0.95, ce_loss_recovered=0.98, l0=32.0, dead_fraction=0.01)


@pytest.mark.parametrize("kind, change, says", [
    ("sae", dict(explained_variance=0.929), "explained variance 0.929 < 0.93"),
    ("sae", dict(ce_loss_recovered=0.969), "CE loss recovered 0.969 < 0.97"),
    ("transcoder", dict(ce_loss_recovered=0.949), "CE loss recovered 0.949 < 0.95"),
    ("transcoder", dict(l0=32.5), "L0 32.5 > 32"),
    ("sae", dict(dead_fraction=0.05), "dead fraction 5.0% >= 5%"),
])
def test_failures_name_each_missed_target(kind, change, says):
    assert ship.failures(kind, GOOD) == []
    assert ship.failures("transcoder", {**GOOD, "explained_variance": 0.90, "ce_loss_recovered": 0.95}) == []
    assert ship.failures(kind, {**GOOD, **change}) == [says]


def test_dead_fractions_equal_sae_metrics_on_the_same_tokens():
    model = sprout.load("gpt-1").eval()
    d = int(model.cfg.d_model)
    sae = interp.SAE(d, 64, kind="topk", k=4, hook_name=act_name("resid_post", 0), seed=1)
    tc = interp.Transcoder(d, 48, d, kind="topk", k=3, layer=0, seed=2)
    with torch.no_grad():
        sae.b_enc[:20] -= 1e3  # never in the top k: dead
        tc.b_enc[:6] += 1e3  # 3 of these 6 are each token's top 3: the other 42 never fire
    text = interp.held_out_stories(3_000, seed=9)
    dead, n = ship.dead_fractions(model, [sae, tc], text)
    ids = windows(model, text)
    assert n == ids.numel()
    for got, d_ in zip(dead, (sae, tc)):
        assert got == pytest.approx(float(interp.sae_metrics(model, d_, ids).iloc[0].dead_fraction), abs=1e-12)
    assert dead[0] >= 20 / 64 and 42 / 48 <= dead[1] <= 45 / 48


def test_share_takes_an_equal_part_of_each_text_past_the_skip():
    texts = ["a" * 100, "b" * 100, "c" * 10]
    assert ship._share(texts, 30) == "a" * 10 + "\n\n" + "b" * 10 + "\n\n" + "c" * 10
    assert ship._share(texts, 30, skip=30) == "a" * 10 + "\n\n" + "b" * 10  # c has nothing past 10


@pytest.mark.parametrize("name", list(ship.RECIPES))
def test_recipes_fit_the_size_budget(name):
    cfg = json.loads((demo_dir() / name / "config.json").read_text())
    r = ship.RECIPES[name]
    d, n = cfg["d_model"], cfg["n_layer"]
    size = sum(4 * (2 * d * e * d + e * d + d) + 4 * d * d * (part == "transcoders" and rl.skip)
               for part in ship.PARTS for rl in (r.at(part, layer) for layer in range(n))
               for e in [rl.expansion if part == "resid" else rl.transcoder_expansion])
    assert size / 2**20 < ship.MAX_MB / 2  # both demos together within the budget
    assert r.k <= ship.MAX_L0 and r.k < r.transcoder_expansion * d


@pytest.mark.parametrize("name", list(ship.RECIPES))
def test_overrides_name_real_dictionaries_and_fit_the_budget(name):
    cfg = json.loads((demo_dir() / name / "config.json").read_text())
    r = ship.RECIPES[name]
    keys = {f"{part} {layer}" for part in ("resid", "transcoder") for layer in range(cfg["n_layer"])}
    assert set(r.overrides) <= keys, set(r.overrides) - keys
    for part in ship.PARTS:
        for layer in range(cfg["n_layer"]):
            rl = r.at(part, layer)
            assert rl.overrides == {} and rl.k < min(rl.expansion, rl.transcoder_expansion) * cfg["d_model"]


def test_an_override_of_the_held_out_texts_is_refused():
    # every dictionary of a demo is measured on the same held-out texts (demo_texts reads them once)
    r = ship.Recipe(overrides={"resid 2": {"held_out_chars": 5_000, "steps": 5}})
    with pytest.raises(ValueError, match="held_out_chars"):
        r.at("resid", 2)
    assert r.at("resid", 1) == ship.Recipe()


def test_a_dictionarys_own_training_prefix_is_what_it_trains_on(monkeypatch):
    seen = {}

    def fake_train_transcoder(model, data, layers, **kw):
        seen[tuple(layers)] = data
        return {}
    monkeypatch.setattr(interp, "train_transcoder", fake_train_transcoder)
    r = ship.Recipe(train_chars=10, overrides={"transcoder 1": {"train_chars": 25}})
    assert r.most_train_chars() == 25
    texts = {"train": "abcdefghijklmnopqrstuvwxyz0123456789"[:r.most_train_chars()], "train_desc": "the first {n} chars"}
    model = sprout.load("gpt-1").eval()
    ship.train_dictionaries(model, r, texts, parts=("transcoders",), layers=[0, 1])
    assert seen == {(0,): texts["train"][:10], (1,): texts["train"][:25]}
    assert ship.train_text(texts, 25) == (texts["train"], "the first 25 chars")


def test_at_applies_only_its_own_override():
    r = ship.Recipe(overrides={"resid 0": {"expansion": 2}, "transcoder 1": {"transcoder_steps": 7}})
    assert r.at("resid", 0).expansion == 2 and r.at("resid", 0).transcoder_steps == r.transcoder_steps
    assert r.at("transcoders", 0) == ship.Recipe() and r.at("resid", 1) == ship.Recipe()
    assert r.at("transcoders", 1).transcoder_steps == 7


def test_dictionaries_sharing_settings_train_together(monkeypatch):
    calls = []
    monkeypatch.setattr(ship, "_train_group", lambda model, r, texts, part, layers: calls.append((part, layers, r)) or {})
    model = sprout.load("gpt-1").eval()
    r = ship.Recipe(overrides={"resid 0": {"steps": 5}})
    ship.train_dictionaries(model, r, {}, layers=[0])
    assert [(p, lay, rl.steps) for p, lay, rl in calls] == [("resid", [0], 5), ("transcoders", [0], r.transcoder_steps)]


def test_phase_tables_come_only_from_the_run_the_weights_came_from(tmp_path):
    gpt1 = sprout.load("gpt-1").eval()
    sprout.save(gpt1, tmp_path / "checkpoints" / "step_00000010")
    with pytest.raises(SystemExit, match="is not gpt-4's weights"):
        ship.ship_phase("gpt-4", sprout.load("gpt-4").eval(), tmp_path)
    with pytest.raises(SystemExit, match="keeps 1 snapshot"):  # its own weights, but nothing to follow over training
        ship.ship_phase("gpt-1", gpt1, tmp_path)


@pytest.mark.parametrize("name", sorted(ship.RECIPES))
def test_steps_override_means_what_it_says_for_every_dictionary(name):
    """`--steps 7` trains every dictionary 7 steps, those whose override sets their own steps too (issue 36)."""
    r = ship.RECIPES[name].with_steps(7)
    model_layers = range(12)
    for part in ("resid", "transcoders"):
        for layer in model_layers:
            at = r.at(part, layer)
            assert at.steps == 7 and at.transcoder_steps == 7, (name, part, layer)
    kept = {k: {f: v for f, v in o.items() if f not in ship.STEP_FIELDS} for k, o in ship.RECIPES[name].overrides.items()}
    assert r.overrides == kept  # the other overrides stand
