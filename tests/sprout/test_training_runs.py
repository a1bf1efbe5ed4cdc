"""The GPU runs of issue 41 staged in training-runs/ for shipping: each loads, agrees with the recipe that
trained it, and keeps the targets its measured numbers meet (training-runs/README.md), checked here with
code of the test's own on small inputs (not `interp`'s functions, so a bug there cannot hide one here)."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sprout
from sprout.files import latest_checkpoint
from sprout.training.recipes import Recipe, get_recipe

RUNS = Path(__file__).resolve().parents[2] / "training-runs"
SHIPPED = ["gpt-1-english-long", "gpt-4-english-long-induction", "sprout-mini-english-long-induction",
           "walkthrough-shakespeare-long"]
STAGE_1 = ["gpt-4-english-long", "sprout-mini-english-long"]  # logs and recipes only: stage 2's `init`
CONFIG_FIELDS = ("vocab_size", "context", "n_layer", "n_head", "d_model")


def recipe(run: str) -> Recipe:
    return Recipe.from_dict(json.loads((RUNS / run / "recipe.json").read_text()))


@pytest.mark.parametrize("run", SHIPPED + STAGE_1)
def test_a_staged_runs_recipe_is_the_codes(run):
    assert recipe(run) == get_recipe(run)
    log = (RUNS / run / "train_log.csv").read_text().splitlines()
    assert int(log[-1].split(",")[0]) == recipe(run).max_steps  # the run finished: its last logged step


@pytest.mark.parametrize("run", SHIPPED)
def test_a_shipped_runs_checkpoint_is_its_recipes_model(run):
    r, ckpt = recipe(run), latest_checkpoint(RUNS / run)
    assert ckpt is not None and ckpt.name == f"step_{r.max_steps:08d}"
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["family"] == r.model
    assert {k: cfg[k] for k in CONFIG_FIELDS if k != "vocab_size"} == {k: getattr(r, k) for k in CONFIG_FIELDS
                                                                       if k != "vocab_size"}
    model = sprout.load(RUNS / run)
    # a BPE model has the recipe's vocabulary; a character model, the characters of its text
    assert (cfg["vocab_size"] == r.vocab_size) == (r.tokenizer == "bpe")
    assert len(model.tokenizer) == cfg["vocab_size"]


@pytest.mark.parametrize("run", STAGE_1)
def test_stage_1_is_the_init_of_stage_2_and_keeps_no_weights(run):
    assert get_recipe(f"{run}-induction").init == f"runs/{run}"
    assert not (RUNS / run / "checkpoints").exists()  # reproducible from its recipe, not kept (size)


def second_copy_loss(model, half: int = 24, n: int = 6, seed: int = 41) -> float:
    """Mean loss on the copyable tokens of `n` rows of `half` random ids (never id 0) shown twice."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(1, int(model.cfg.d_vocab), (n, half), generator=g)
    ids = torch.cat([first, first], dim=1)
    with torch.no_grad():
        logits = model(ids)  # [n, 2 * half, d_vocab]
    # position p predicts token p + 1; the second copy's tokens 2..half follow a token already seen
    pred = logits[:, half:-1].reshape(-1, logits.shape[-1])
    return F.cross_entropy(pred.float(), ids[:, half + 1:].reshape(-1)).item()


@pytest.mark.parametrize("run", ["gpt-4-english-long-induction", "sprout-mini-english-long-induction"])
def test_the_induction_demos_copy_repeated_random_tokens(run):
    model = sprout.load(RUNS / run).eval()
    assert second_copy_loss(model) < 0.1  # issue 41's target; measured 0.004 and 0.003 (README)
    assert second_copy_loss(model, half=32, seed=7) < 0.1


def test_the_walkthrough_predicts_held_out_shakespeare_within_the_target():
    model = sprout.load(RUNS / "walkthrough-shakespeare-long").eval()
    text = (RUNS / "walkthrough-shakespeare-long" / "val.txt").read_text(encoding="utf-8")
    ids = torch.tensor(model.tokenizer.encode(text))
    n_ctx, k = int(model.cfg.n_ctx), 24  # 24 windows spread evenly over the whole held-out text
    starts = torch.linspace(0, len(ids) - n_ctx, k).long()
    rows = torch.stack([ids[s:s + n_ctx] for s in starts.tolist()])
    with torch.no_grad():
        logits = model(rows)  # [k, n_ctx, d_vocab]
    nats = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), rows[:, 1:].reshape(-1)).item()
    assert nats <= 1.7  # issue 41's target; measured 1.63 on all 252,535 characters (README)
