"""experiments.ship's checks: the targets' wording, the dead fraction counted over many tokens in one
forward (equal to interp.sae_metrics' count on the same tokens), the held-out share of several texts,
and the recipes' dictionaries (the cross-layer transcoder with them) fitting the size budget."""
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import interp
import sprout
from experiments import ship, ship_clt, ship_swap, ship_targets
from interp._core.identity import model_config
from interp.saes.convert import to_jumprelu
from sprout.files import demo_dir
from sprout.training.english import equal_shares

GOOD = dict(l0=16.0, dead_fraction=0.01, d_sae=1536, ev_margin=0.12, ce_margin=0.05, ce_loss_recovered_mean=0.93)


@pytest.mark.parametrize("kind, change, says", [
    ("sae", dict(ev_margin=0.049), "explained variance +0.049 over the PCA code (< 0.05)"),
    ("sae", dict(ce_margin=0.029), "CE recovered (mean ablation) +0.029 over the PCA code (< 0.03)"),
    ("sae", dict(d_sae=1535), "1535 latents < 8 d_model"),
    ("transcoder", dict(ev_margin=0.099), "explained variance +0.099 over the best of regression and top neurons (< 0.1)"),
    ("transcoder", dict(ce_loss_recovered_mean=0.899), "CE recovered (mean ablation) 0.899 < 0.9"),
    ("transcoder", dict(ce_loss_recovered_mean=0.89996), "CE recovered (mean ablation) 0.89996 < 0.9"),
    ("sae", dict(ev_margin=0.04996), "explained variance +0.04996 over the PCA code (< 0.05)"),
    ("transcoder", dict(l0=16.5), "L0 16.5 > 16 (d_model / 12)"),
    ("transcoder", dict(l0=16.04), "L0 16.04 > 16 (d_model / 12)"),
    ("sae", dict(dead_fraction=0.05), "dead fraction 5.0% >= 5%"),
])
def test_failures_name_each_missed_target(kind, change, says):
    assert ship.failures(kind, GOOD, 192) == []
    assert ship.failures(kind, {**GOOD, **change}, 192) == [says]
    assert ship_targets.max_l0(192) == 16 and ship_targets.max_l0(128) == 10
    assert ship_targets.default_k(192) == 12 and ship_targets.default_k(128) == 8


def test_share_takes_an_equal_part_of_each_text_past_the_skip():
    texts = ["a" * 100, "b" * 100, "c" * 10]
    assert ship._share(texts, 30) == "a" * 10 + "\n\n" + "b" * 10 + "\n\n" + "c" * 10
    assert ship._share(texts, 30, skip=30) == "a" * 10 + "\n\n" + "b" * 10  # c has nothing past 10


def plan_bytes(name: str) -> int:
    """The bytes of float32 weights the demo's shipping plan writes (per-layer dictionaries and the CLT)."""
    cfg = json.loads((demo_dir() / name / "config.json").read_text())
    r = ship.SHIP_PLANS[name]
    d, n = cfg["d_model"], cfg["n_layer"]
    size = sum(4 * (2 * d * e * d + e * d + d + e) + 4 * d * d * skip  # + e: the JumpReLU threshold
               for part in ship.PARTS for rl in (r.at(part, layer) for layer in range(n))
               for skip in ([False] if part == "resid" else rl.skips)
               for e in [rl.expansion if part == "resid" else rl.transcoder_width(skip)])
    # the cross-layer transcoder: W_enc, b_enc, threshold per layer; W_dec_l [d_sae, n - l, d]; b_dec
    e = round(ship.CLT_PLANS[name].expansion * d) if name in ship.CLT_PLANS else 0
    return size + 4 * (n * (d * e + 2 * e) + e * d * n * (n + 1) // 2 + n * d)


def test_the_plans_fit_the_size_budget_together():
    # the budget is of every demo's dictionaries together (ship_swap.MAX_MB), not half each; 0.5 MB for what the
    # weights leave out (cfg.json, safetensors headers: 0.3 MB on the shipped set)
    assert sum(plan_bytes(name) for name in ship.SHIP_PLANS) / 2**20 < ship_swap.MAX_MB - 0.5


@pytest.mark.parametrize("name", list(ship.SHIP_PLANS))
def test_recipes_are_sparse_and_wide_enough(name):
    cfg = json.loads((demo_dir() / name / "config.json").read_text())
    r = ship.SHIP_PLANS[name]
    d = cfg["d_model"]
    k = ship_targets.default_k(d) if r.k is None else r.k
    assert k <= d / 12 and r.expansion >= ship_targets.MIN_EXPANSION and set(r.skips) == {True, False}


@pytest.mark.parametrize("name", list(ship.SHIP_PLANS))
def test_overrides_name_real_dictionaries_and_fit_the_budget(name):
    cfg = json.loads((demo_dir() / name / "config.json").read_text())
    r = ship.SHIP_PLANS[name]
    keys = {f"{part} {layer}" for part in ("resid", "transcoder") for layer in range(cfg["n_layer"])}
    assert set(r.overrides) <= keys, set(r.overrides) - keys
    for part in ship.PARTS:
        for layer in range(cfg["n_layer"]):
            rl = r.at(part, layer)
            k = ship_targets.default_k(cfg["d_model"]) if rl.k is None else rl.k
            assert rl.overrides == {} and k < min(rl.expansion, rl.transcoder_expansion) * cfg["d_model"]


def test_an_override_of_the_held_out_texts_is_refused():
    # every dictionary of a demo is measured on the same held-out texts (demo_texts reads them once)
    r = ship.ShipPlan(overrides={"resid 2": {"held_out_chars": 5_000, "steps": 5}})
    with pytest.raises(ValueError, match="held_out_chars"):
        r.at("resid", 2)
    assert r.at("resid", 1) == ship.ShipPlan()


@pytest.fixture
def trained_on(monkeypatch) -> dict:
    """{(layers of one transcoder group, skip): the text it was given}, with `interp.train_transcoder` replaced by
    a recorder that trains nothing (it returns untrained transcoders)."""
    seen: dict = {}

    def record(model, data, layers, *, skip, **kw):
        seen[tuple(layers), skip] = data
        return {layer: interp.Transcoder(16, 32, 16, kind="topk", k=2, layer=layer, skip=skip) for layer in layers}
    monkeypatch.setattr(interp, "train_transcoder", record)
    return seen


def test_a_dictionarys_own_training_prefix_is_what_it_trains_on(trained_on):
    r = ship.ShipPlan(train_chars=10, overrides={"transcoder 1": {"train_chars": 25}})
    assert r.most_train_chars() == 25
    texts = {"train": "abcdefghijklmnopqrstuvwxyz0123456789"[:r.most_train_chars()], "train_desc": "the first {n} chars"}
    model = sprout.load("gpt-1").eval()
    ship.train_dictionaries(model, r, texts, parts=("transcoders",), layers=[0, 1])
    assert trained_on == {((layer,), skip): texts["train"][:n] for layer, n in ((0, 10), (1, 25)) for skip in (True, False)}
    assert ship.train_text(texts, 25) == (texts["train"], "the first 25 chars")


def test_at_applies_only_its_own_override():
    r = ship.ShipPlan(overrides={"resid 0": {"expansion": 2}, "transcoder 1": {"transcoder_steps": 7}})
    assert r.at("resid", 0).expansion == 2 and r.at("resid", 0).transcoder_steps == r.transcoder_steps
    assert r.at("transcoders", 0) == ship.ShipPlan() and r.at("resid", 1) == ship.ShipPlan()
    assert r.at("transcoders", 1).transcoder_steps == 7


def test_dictionaries_sharing_settings_train_together(monkeypatch):
    calls = []
    monkeypatch.setattr(ship, "_train_group", lambda model, r, texts, part, layers: calls.append((part, layers, r)) or {})
    model = sprout.load("gpt-1").eval()
    r = ship.ShipPlan(overrides={"resid 0": {"steps": 5}})
    ship.train_dictionaries(model, r, {}, layers=[0])
    assert [(p, lay, rl.steps) for p, lay, rl in calls] == [("resid", [0], 5), ("transcoders", [0], r.transcoder_steps)]


def test_phase_tables_come_only_from_the_run_the_weights_came_from(tmp_path):
    gpt1 = sprout.load("gpt-1").eval()
    sprout.save(gpt1, tmp_path / "checkpoints" / "step_00000010")
    with pytest.raises(SystemExit, match="is not gpt-4's weights"):
        ship.ship_phase("gpt-4", sprout.load("gpt-4").eval(), tmp_path)
    with pytest.raises(SystemExit, match="keeps 1 snapshot"):  # its own weights, but nothing to follow over training
        ship.ship_phase("gpt-1", gpt1, tmp_path)


def test_transcoders_train_with_and_without_skip_and_ship_as_jumprelu(monkeypatch):
    def fake_train_transcoder(model, data, layers, skip, d_sae, k, kind, **kw):
        d = int(model.cfg.d_model)
        out = {}
        for layer in layers:
            tc = interp.Transcoder(d, d_sae, d, kind=kind, k=k, skip=skip, layer=layer)
            tc.threshold.fill_(0.5)
            out[layer] = tc
        return out
    monkeypatch.setattr(interp, "train_transcoder", fake_train_transcoder)
    model = sprout.load("gpt-1").eval()
    got = ship._train_group(model, ship.ShipPlan(), {"train": "abc", "train_desc": "{n}"}, "transcoders", [0, 1])
    assert sorted(got) == [(0, False), (0, True), (1, False), (1, True)]
    d = int(model.cfg.d_model)
    for (layer, skip), tc in got.items():
        assert tc.kind == "jumprelu" and tc.skip == skip and tc.layer == layer and (tc.threshold == 0.5).all()
        assert tc.d_sae == 2 * d and tc.info["converted_from"] == "batchtopk"


@pytest.mark.parametrize("name", sorted(ship.SHIP_PLANS))
def test_steps_override_means_what_it_says_for_every_dictionary(name):
    """`--steps 7` trains every dictionary 7 steps, those whose override sets their own steps too (issue 36)."""
    r = ship.SHIP_PLANS[name].with_steps(7)
    model_layers = range(12)
    for part in ("resid", "transcoders"):
        for layer in model_layers:
            at = r.at(part, layer)
            assert at.steps == 7 and at.transcoder_steps_of(True) == at.transcoder_steps_of(False) == 7, (name, part, layer)
            assert at.kl_steps in (0, 7) and (at.kl_steps == 7) == bool(ship.SHIP_PLANS[name].at(part, layer).kl_steps)
    kept = {k: {f: v for f, v in o.items() if f not in ship.STEP_FIELDS} for k, o in ship.SHIP_PLANS[name].overrides.items()}
    assert {k: {f: v for f, v in o.items() if f != "kl_steps"} for k, o in r.overrides.items()} == kept  # the others stand


def test_transcoders_without_a_skip_take_their_own_width_and_steps_and_skips_picks_one_kind(monkeypatch, tiny_model):
    asked = []

    def fake(model, data, layers, *, steps, skip, d_sae, **kw):
        asked.append((skip, d_sae, steps))
        return {l: interp.Transcoder(16, d_sae, 16, kind="topk", k=2, layer=l, skip=skip) for l in layers}
    monkeypatch.setattr(ship.interp, "train_transcoder", fake)
    r = ship.ShipPlan(transcoder_expansion=8, noskip_expansion=2, transcoder_steps=40, noskip_steps=10, k=2)
    d = int(tiny_model.cfg.d_model)
    texts = dict(train="some text " * 50, train_desc="{n} chars")
    out = ship._train_group(tiny_model, r, texts, "transcoders", [0])
    assert asked == [(True, 8 * d, 40), (False, 2 * d, 10)] and set(out) == {(0, True), (0, False)}
    assert out[(0, False)].info["recipe"]["noskip_expansion"] == 2 and out[(0, False)].info["recipe"]["noskip_steps"] == 10
    assert ship.ShipPlan(transcoder_expansion=3).transcoder_width(False) == 3  # None: the same width as with a skip
    assert ship.ShipPlan(transcoder_steps=30).transcoder_steps_of(False) == 30  # None: as many steps as with a skip

    seen = []
    monkeypatch.setattr(ship, "ship_saes", lambda name, model, r, parts, **kw: seen.append(r))
    for flag, want in (("skip", (True,)), ("noskip", (False,))):
        assert ship.main(["gpt-4", "--only", "saes", "--parts", "transcoders", "--skips", flag]) == 0
        assert seen[-1].skips == want and seen[-1].transcoder_expansion == ship.SHIP_PLANS["gpt-4"].transcoder_expansion


def stamped(sae, model):
    sae.model_fingerprint, sae.model_config = interp.fingerprint(model), model_config(model)
    return sae


def test_remeasure_of_the_clt_trains_nothing_and_says_when_none_is_shipped(monkeypatch):
    calls = []
    monkeypatch.setattr(ship, "demo_texts", lambda name, r: {"held": "h"})
    monkeypatch.setattr(ship, "ship_clt", lambda *a, **k: pytest.fail("--remeasure trained a CLT"))
    monkeypatch.setattr(ship, "remeasure_clt", lambda name, model, texts: calls.append((name, texts)) or Path("clt"))
    assert ship.main(["gpt-4", "--only", "clt", "--remeasure"]) == 0 and calls == [("gpt-4", {"held": "h"})]
    monkeypatch.setattr(ship, "remeasure_clt", lambda name, model, texts: None)
    with pytest.raises(SystemExit, match="ships no cross-layer transcoder to re-measure"):
        ship.main(["gpt-4", "--only", "clt", "--remeasure"])
    for argv, says in ((["--remeasure"], "give --only saes and/or clt"),
                       (["--only", "lens", "saes", "--remeasure"], "give --only saes and/or clt"),
                       (["--only", "saes", "--remeasure", "--frontier", "--steps", "5"], "leave out --steps, --frontier")):
        with pytest.raises(SystemExit, match=says):  # refused before anything is loaded, trained or written
            ship.main(["gpt-4", *argv])


def test_remeasure_rewrites_each_record_and_nothing_else(tmp_path, monkeypatch):
    """--remeasure: the shipped per-layer dictionaries measured again, their held-out records (misses included)
    rewritten; weights, recipes and training records as they were; the CLT's comparison measured again."""
    monkeypatch.setattr(ship, "demo_dir", lambda: tmp_path)
    monkeypatch.setattr(sprout.files, "demo_dir", lambda: tmp_path)
    (tmp_path / "gpt-1").mkdir()
    model = sprout.load("gpt-1").eval()
    d = int(model.cfg.d_model)
    texts = dict(train="t", train_desc="{n}", held="h", held_desc="held-out", dead="x")
    monkeypatch.setattr(ship, "demo_texts", lambda name, r: texts)
    with pytest.raises(SystemExit, match="no shipped dictionary"):
        ship.remeasure_saes("gpt-1", model, ship.ShipPlan())
    sae = stamped(interp.SAE(d, 8 * d, kind="topk", k=2, hook_name="blocks.0.hook_resid_post", seed=1), model)
    tc = stamped(interp.Transcoder(d, 2 * d, d, kind="topk", k=2, layer=0, seed=2), model)
    for s in (sae, tc):
        s.info = {"recipe": {"steps": 5}, "train_seconds_all": 9.0, "held_out": {"ce_loss_recovered_mean": 0.5}}
    ship_swap.write_set(tmp_path / "gpt-1" / "saes", [(sae, tmp_path / "gpt-1" / "saes" / "blocks.0.hook_resid_post"),
                                                      (tc, tmp_path / "gpt-1" / "saes" / "transcoder-0-noskip")])
    good = dict(l0=2.0, d_sae=8 * d, ev_margin=0.2, ce_margin=0.1, ce_loss_recovered_mean=0.95,
                ce_loss_recovered_mean_se=0.01, explained_variance=0.9, best_baseline="pca", ce_loss_recovered=0.96)
    monkeypatch.setattr(ship, "held_out_metrics", lambda model, s, text, fits: {
        **good, "ce_loss_recovered_mean": 0.7 if isinstance(s, interp.Transcoder) else 0.95})
    monkeypatch.setattr(ship.interp.saes, "dead_fractions", lambda model, saes, text: ([0.0] * len(saes), 4096))
    clt_calls = []
    monkeypatch.setattr(ship, "remeasure_clt", lambda name, model, texts: clt_calls.append(name))
    written = ship.remeasure_saes("gpt-1", model, ship.ShipPlan())
    assert [w.name for w in written] == ["blocks.0.hook_resid_post", "transcoder-0-noskip"] and clt_calls == ["gpt-1"]
    for folder, weights in zip(written, (sae, tc)):
        info = json.loads((folder / "cfg.json").read_text())["metadata"]["sprout"]["info"]
        assert info["recipe"] == {"steps": 5} and info["train_seconds_all"] == 9.0
        assert info["held_out"]["data"] == "held-out" and info["held_out"]["dead_tokens_measured"] == 4096
    again = interp.load_transcoder(model, 0, skip=False)
    assert torch.equal(again.W_dec, tc.W_dec) and again.info["held_out"]["misses"] == ["CE recovered (mean ablation) 0.700 < 0.9"]
    assert interp.load_sae(model, "blocks.0.hook_resid_post").info["held_out"]["misses"] == []


def two_sources() -> dict:
    """demo_texts' fields for an English demo of two sources, one 200 times the other."""
    sources = {"big": "\n\n".join(f"big {i} " + "b" * 40 for i in range(100)), "small": "small " + "s" * 20}
    return {"train": sources["big"], "train_desc": "the first {n} chars", "sources": sources}


def test_train_mix_equal_trains_on_the_sources_in_equal_shares(trained_on):
    texts = two_sources()
    sources = texts["sources"]
    r = ship.ShipPlan(train_chars=600, skips=(True,), overrides={"transcoder 1": {"train_mix": "equal"}})
    out = ship.train_dictionaries(sprout.load("gpt-1").eval(), r, texts, parts=("transcoders",), layers=[0, 1])
    assert trained_on[(0,), True] == texts["train"][:600] and trained_on[(1,), True] == equal_shares(sources, 600)
    assert [out[layer, True].info["recipe"]["train_mix"] for layer in (0, 1)] == ["shares", "equal"]
    assert "equal shares (big, small" in ship.train_text(texts, 600, "equal")[1]
    with pytest.raises(SystemExit, match="has none"):  # a stories demo has no sources to mix
        ship.train_text({"train": "x", "train_desc": "{n}"}, 1, "equal")
    with pytest.raises(ValueError, match="train_mix must be one of"):
        ship.ShipPlan(train_mix="balanced")
    with pytest.raises(ValueError, match="got 'half'"):
        ship.ShipPlan(overrides={"transcoder 0": {"train_mix": "half"}})


def test_transcoders_without_a_skip_take_their_own_mix(trained_on):
    texts = two_sources()
    sources = texts["sources"]
    r = ship.ShipPlan(train_chars=600, noskip_train_mix="equal", overrides={"transcoder 1": {"train_mix": "equal"}})
    out = ship.train_dictionaries(sprout.load("gpt-1").eval(), r, texts, parts=("transcoders",), layers=[0, 1])
    equal = equal_shares(sources, 600)
    assert trained_on == {((0,), True): texts["train"][:600], ((0,), False): equal, ((1,), True): equal, ((1,), False): equal}
    assert {key: tc.info["recipe"]["train_mix"] for key, tc in out.items()} == {
        (0, True): "shares", (0, False): "equal", (1, True): "equal", (1, False): "equal"}
    assert ship_clt.CltPlan.of(r).train_mix == "equal" and ship_clt.CltPlan.of(ship.ShipPlan()).train_mix == "shares"
    with pytest.raises(ValueError, match="got 'mixed'"):
        ship.ShipPlan(noskip_train_mix="mixed")


def test_baselines_are_fitted_on_the_mix_each_dictionary_trained_on(monkeypatch):
    fitted = []
    monkeypatch.setattr(ship_targets, "fit_baselines", lambda model, sae, text: fitted.append(text) or len(fitted))
    fits = ship_targets.BaselineFits(None, lambda mix: f"text of {mix}")
    tcs = [interp.Transcoder(16, 32, 16, kind="topk", k=2, layer=0, skip=skip) for skip in (True, False)]
    tcs[1].info["recipe"] = {"train_mix": "equal"}
    assert [fits.of(tc) for tc in tcs + tcs] == [1, 2, 1, 2]  # each fitted once
    assert fitted == ["text of shares", "text of equal"]
    assert ship_targets.BaselineFits(None, "one text").of(tcs[1]) == 3 and fitted[-1] == "one text"


def test_a_dictionary_with_kl_steps_is_fine_tuned_on_its_own_training_text(trained_on, monkeypatch):
    tuned = {}

    def finetune(model, sae, data, *, steps, lr, mse_coefficient, batch_windows, seed):
        tuned[sae.layer, sae.skip] = (data, steps, lr, mse_coefficient, batch_windows)
        return sae
    monkeypatch.setattr(interp, "finetune_kl", finetune)
    texts = two_sources()
    r = ship.ShipPlan(train_chars=600, kl_lr=1e-3, overrides={"transcoder 1": {"train_mix": "equal", "kl_steps": 40}})
    out = ship.train_dictionaries(sprout.load("gpt-1").eval(), r, texts, parts=("transcoders",), layers=[0, 1])
    equal = equal_shares(texts["sources"], 600)
    assert tuned == {(1, skip): (equal, 40, 1e-3, 0.1, 16) for skip in (True, False)}  # MLP 0's: none
    assert {key: tc.info["recipe"]["kl_steps"] for key, tc in out.items()} == {
        (0, True): 0, (0, False): 0, (1, True): 40, (1, False): 40}
    only = ship.ShipPlan(train_chars=600, overrides={"transcoder 0": {"kl_steps": 40, "kl_skips": (False,)}})
    tuned.clear()
    ship.train_dictionaries(sprout.load("gpt-1").eval(), only, texts, parts=("transcoders",), layers=[0, 1])
    assert list(tuned) == [(0, False)]  # kl_skips: only the transcoder without a skip
    quick = ship.ShipPlan(kl_steps=500, overrides={"transcoder 1": {"kl_steps": 40}}).with_steps(7)
    assert quick.kl_steps == 7 and quick.at("transcoders", 1).kl_steps == 7 and ship.ShipPlan().with_steps(7).kl_steps == 0


def test_finetune_takes_the_shipped_dictionaries_the_plan_fine_tunes(monkeypatch):
    r = ship.ShipPlan(train_chars=600, overrides={"transcoder 1": {"kl_steps": 40, "train_mix": "equal"}})

    def shipped(layer, skip, recipe, tuned=False):
        tc = interp.Transcoder(16, 32, 16, kind="batchtopk", k=2, layer=layer, skip=skip)
        tc.info = {"settings": {"k": 2}, "recipe": json.loads(json.dumps(asdict(recipe)))}
        if tuned:
            tc.info["kl_finetune"] = {"steps": 40}
        return to_jumprelu(tc)
    plan1 = r.at("transcoders", 1)
    found = {(0, True): shipped(0, True, r.at("transcoders", 0)), (1, True): shipped(1, True, plan1),
             (1, False): shipped(1, False, plan1, tuned=True)}
    monkeypatch.setattr(ship, "shipped_dictionaries", lambda model, parts, layers, skips: dict(found))
    monkeypatch.setattr(ship, "demo_texts", lambda name, plan: two_sources())
    seen = {}
    monkeypatch.setattr(interp, "finetune_kl", lambda model, sae, data, **kw: seen.setdefault("args", (sae, data, kw))[0])
    monkeypatch.setattr(ship, "_measure_and_write", lambda name, model, texts, tuned, keep, frontier, s: tuned)
    out = ship.finetune_saes("demo", None, r, parts=("transcoders",))
    sae, data, kw = seen["args"]
    assert list(out) == [(1, True)] and sae.kind == "batchtopk" and data == equal_shares(two_sources()["sources"], 600)
    assert kw["steps"] == 40 and out[1, True].kind == "jumprelu" and out[1, True].info["recipe"]["kl_steps"] == 40
    own = ship.ShipPlan(train_chars=600, overrides={"transcoder 1": {"kl_steps": 40, "train_mix": "equal", "train_chars": 300}})
    found[1, True] = shipped(1, True, own.at("transcoders", 1))
    seen.clear()
    ship.finetune_saes("demo", None, own, parts=("transcoders",))
    assert seen["args"][1] == equal_shares(two_sources()["sources"], 300)  # the override's own training prefix
    found[1, True] = shipped(1, True, plan1)
    found[1, True].info["recipe"]["k"] = 5  # trained otherwise than the plan says: train it again
    with pytest.raises(SystemExit, match=r"other settings \(k\)"):
        ship.finetune_saes("demo", None, r, parts=("transcoders",))
    del found[1, True]
    with pytest.raises(SystemExit, match="not fine-tuned yet"):
        ship.finetune_saes("demo", None, r, parts=("transcoders",))
    with pytest.raises(SystemExit, match="give --only saes"):
        ship.main(["gpt-4", "--only", "clt", "--finetune"])
