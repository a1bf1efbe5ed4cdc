"""Training: the schedule, the optimiser groups, the curriculum batches, the CLI, checkpoints and resume."""
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import sprout
from sprout import Sprout
from sprout.training.cli import parse_args
from sprout.training.corpus import prepare_data
from sprout.training.curriculum import repeat_rows
from sprout.training.loop import NonFiniteLoss, lr_at, make_optimizer, snapshot_steps, train
from sprout.training.recipes import RECIPES, Recipe, get_recipe

ROOT = Path(__file__).resolve().parents[3]
TINY = get_recipe("tiny")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One tokenised tiny corpus for the whole module (building it is the slow part of a tiny run)."""
    root = tmp_path_factory.mktemp("cache")
    prepare_data(TINY, root)
    return root


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    r = Recipe(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert lr_at(0, r) == pytest.approx(1e-4)
    assert lr_at(4, r) == pytest.approx(5e-4)
    assert lr_at(9, r) == pytest.approx(1e-3)
    assert lr_at(60, r) == pytest.approx((1e-3 + 1e-4) / 2)  # half way through the cosine
    assert lr_at(110, r) == pytest.approx(1e-4)
    after = [lr_at(s, r) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:]))


def test_weight_decay_applies_to_matrices_only_and_each_parameter_once(tiny_cfg):
    model = Sprout(tiny_cfg)
    opt = make_optimizer(model, Recipe(weight_decay=0.1))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))  # tied head counted once


def test_repeat_rows_repeat_random_segments_and_mask_exactly_the_copyable_targets():
    g = torch.Generator().manual_seed(0)
    x, y, mask = repeat_rows(6, 100, 500, 5, 20, g)
    assert x.shape == y.shape == mask.shape == (6, 100)
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y, row_m in zip(x.tolist(), y.tolist(), mask.tolist()):
        seq = row_x + row_y[-1:]
        for t, m in enumerate(row_m):
            # copyable: the bigram (x[t], y[t]) already occurred earlier in the row
            seen = any(seq[j] == seq[t] and seq[j + 1] == seq[t + 1] for j in range(t))
            if m:
                assert seen, f"masked-in target at {t} is not a repeat"
        assert 0.3 < sum(row_m) / len(row_m) < 0.55  # roughly the second copies, less their first tokens
        # random lengths: the offset back to the match is not always the same
    offsets = set()
    for row_x, row_m in zip(x.tolist(), mask.tolist()):
        for t, m in enumerate(row_m):
            if m:
                offsets.add(next(t - j for j in range(t - 1, -1, -1) if row_x[j] == row_x[t]))
    assert len(offsets) > 3


def test_repeat_rows_can_draw_segments_from_the_corpus():
    corpus = np.array([7, 9, 7, 7, 9] * 20, dtype=np.uint16)
    g = torch.Generator().manual_seed(0)
    x, y, mask = repeat_rows(4, 60, 500, 5, 20, g, corpus, unigram=1.0)
    assert set(x.flatten().tolist()) <= {7, 9}
    x, _, _ = repeat_rows(4, 60, 500, 5, 20, g, corpus, unigram=0.0)
    assert len(set(x.flatten().tolist())) > 50


def test_snapshot_steps_are_log_spaced():
    # four per decade: round(10 ** (k / 4))
    assert snapshot_steps(100) == {0, 1, 2, 3, 6, 10, 18, 32, 56, 100}
    assert snapshot_steps(150) == {0, 1, 2, 3, 6, 10, 18, 32, 56, 100, 150}


def test_cli_overrides_recipe_fields_and_rejects_unknown_flags_and_bad_values(capsys):
    args, recipe = parse_args(["--recipe", "tiny", "--out", "x", "--lr", "0.01", "--max-steps", "7",
                               "--snapshots"])
    assert recipe == TINY.override(lr=0.01, max_steps=7, snapshots=True)
    with pytest.raises(SystemExit):
        parse_args(["--recipe", "tiny", "--out", "x", "--learning-rate", "0.01"])
    assert "--learning-rate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--recipe", "tiny", "--out", "x", "--repeat-fraction", "1.5"])
    assert "repeat_fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--recipe", "nope", "--out", "x"])


def test_recipe_from_dict_names_unknown_keys():
    with pytest.raises(ValueError, match="lerning_rate"):
        Recipe.from_dict({**TINY.to_dict(), "lerning_rate": 1.0})
    assert Recipe.from_dict(json.loads(TINY.to_json())) == TINY
    assert set(RECIPES) >= {"tiny", "gpt-1", "gpt-4", "sprout-mini", "walkthrough"}


def test_run_writes_log_recipe_checkpoints_and_keeps_the_last_two(tmp_path, cache):
    out = tmp_path / "run"
    trained = train(TINY.override(max_steps=30), out, data_cache=cache, progress=False)
    steps = sorted(d.name for d in (out / "checkpoints").iterdir())
    assert steps == ["step_00000020", "step_00000030"]
    last = out / "checkpoints" / "step_00000030"
    assert Recipe.from_dict(json.loads((out / "recipe.json").read_text())) == TINY.override(max_steps=30)
    rows = (out / "train_log.csv").read_text().splitlines()
    assert rows[0].split(",")[:5] == ["step", "tokens", "lr", "train_loss", "val_loss"]
    assert [r.split(",")[0] for r in rows[1:]] == ["10", "20", "30"]
    assert all(math.isfinite(float(r.split(",")[4])) for r in rows[1:])
    first, final = float(rows[1].split(",")[4]), float(rows[-1].split(",")[4])
    assert final < first  # it learns
    model = sprout.load(out)  # a run directory loads its latest checkpoint
    saved = load_file(str(last / "model.safetensors"))
    assert torch.equal(model.embed.weight, saved["embed.weight"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    assert model.tokenizer is not None and model.tokenizer.get_vocab_size() == TINY.vocab_size
    state = torch.load(last / "trainer.pt", weights_only=True)
    assert state["step"] == 30 and len(state["rng"]) == 1
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(TINY.override(max_steps=30), out, data_cache=cache, progress=False)
    with pytest.raises(ValueError, match="lr: run has"):
        train(TINY.override(max_steps=30, lr=1e-2), out, data_cache=cache, resume=True, progress=False)


def test_init_starts_a_second_stage_from_a_run_s_weights(tmp_path, cache):
    first = tmp_path / "first"
    train(TINY.override(max_steps=10), first, data_cache=cache, progress=False)
    stage = TINY.override(max_steps=0, init=str(first), seed=5, snapshots=True)  # step 0 = the weights it starts from
    train(stage, tmp_path / "second", data_cache=cache, progress=False)
    start, init = sprout.load(tmp_path / "second" / "checkpoints" / "step_00000000"), sprout.load(first)
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), init.state_dict().values()))
    fresh = TINY.override(max_steps=0, seed=5, snapshots=True)  # the same seed without init: other weights
    train(fresh, tmp_path / "fresh", data_cache=cache, progress=False)
    assert not torch.equal(sprout.load(tmp_path / "fresh").embed.weight, init.embed.weight)
    with pytest.raises(ValueError, match="init \\(--init\\): no checkpoint"):
        train(TINY.override(init=str(tmp_path / "nothing")), tmp_path / "third", data_cache=cache, progress=False)
    with pytest.raises(ValueError, match="do not fit the recipe's model"):
        train(TINY.override(init=str(first), d_ff=48), tmp_path / "fourth", data_cache=cache, progress=False)


def test_snapshots_keep_log_spaced_checkpoints(tmp_path, cache):
    out = tmp_path / "run"
    train(TINY.override(max_steps=40, snapshots=True), out, data_cache=cache, progress=False)
    steps = {int(d.name[5:]) for d in (out / "checkpoints").iterdir()}
    # snapshots 0 1 2 3 6 10 18 32 40, plus the last two ordinary checkpoints (every 10: 20, 30)
    assert steps == {0, 1, 2, 3, 6, 10, 18, 20, 30, 32, 40}


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_last_good_checkpoint(tmp_path, cache,
                                                                                     monkeypatch):
    calls = {"n": 0}
    forward = Sprout.forward

    def poisoned(self, *args, **kwargs):
        loss = forward(self, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 15:
                loss = loss * float("nan")
        return loss

    monkeypatch.setattr(Sprout, "forward", poisoned)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match=r"nan .* at step 16 .*step_00000010"):
        train(TINY, out, data_cache=cache, progress=False)
    assert sorted(d.name for d in (out / "checkpoints").iterdir()) == ["step_00000010"]
    model = sprout.load(out)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def _train_cmd(out, cache, *extra):
    return [sys.executable, "-m", "sprout.train", "--recipe", "tiny", "--out", str(out), "--data-cache",
            str(cache), "--max-steps", "80", "--ckpt-every", "10", "--no-progress", "--threads", "1", *extra]


def test_resume_after_sigkill_gives_bit_identical_weights(tmp_path, cache):
    env = dict(os.environ)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    # the uninterrupted run goes on beside the other (one thread each): both are deterministic
    whole = subprocess.Popen(_train_cmd(straight, cache), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(_train_cmd(broken, cache), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (broken / "checkpoints" / "step_00000020").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (broken / "checkpoints" / "step_00000080").exists()
    subprocess.run(_train_cmd(broken, cache, "--resume"), cwd=ROOT, env=env, check=True, capture_output=True)
    _, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err[-3000:]

    a = load_file(str(straight / "checkpoints" / "step_00000080" / "model.safetensors"))
    b = load_file(str(broken / "checkpoints" / "step_00000080" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop_time = lambda p: [r.rsplit(",", 1)[0] for r in (p / "train_log.csv").read_text().splitlines()]
    assert drop_time(straight) == drop_time(broken)  # the log was cut back to the checkpoint and redone


def test_import_sprout_does_not_import_the_trainer_and_the_old_entry_point_still_works():
    # interp's trainers share the trainer core (sprout.training.core), which comes without the loop
    code = ("import sys, sprout, interp; trainer = [m for m in sys.modules if m.startswith('sprout.training') "
            "and m not in ('sprout.training', 'sprout.training.core')]; assert not trainer, trainer; "
            "import sprout.train, sprout.training.cli; assert sprout.train.main is sprout.training.cli.main")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)


def test_every_train_flag_has_its_recipe_fields_comment_as_help(capsys):
    """`sprout train --help` explains every flag, each recipe override by its field's comment."""
    from dataclasses import fields as dataclass_fields

    from sprout.settings import field_comments
    from sprout.training import cli as train_cli
    from sprout.training.recipes import Recipe, flag

    with pytest.raises(SystemExit):
        train_cli.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    comments = field_comments(Recipe)
    assert set(comments) == {f.name for f in dataclass_fields(Recipe)}  # no field without a comment
    assert "--grad-clip FLOAT max global gradient norm; 0 = no clipping (as in nanoGPT)" in out
    assert "--snapshots, --no-snapshots also keep log-spaced checkpoints" in out
    for f in dataclass_fields(Recipe):
        assert " ".join(comments[f.name].split())[:40] in out, flag(f.name)


@dataclasses.dataclass(frozen=True)
class _Commented:
    # --- a section rule, never help
    steps: int = 10  # optimizer steps;
    # one batch each
    seed: int = 0  # of the batches
    # where the run starts from:
    # a folder or a checkpoint
    init: str = ""
    bare: int = 1

    LIMIT = 3  # not a field


def test_field_comments_reads_trailing_continued_and_leading_comments():
    from sprout.settings import field_comments

    assert field_comments(_Commented) == {"steps": "optimizer steps; one batch each", "seed": "of the batches",
                                          "init": "where the run starts from: a folder or a checkpoint"}
