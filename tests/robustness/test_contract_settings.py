"""One checked-settings type (sprout.settings) behind `sprout train`'s Recipe and train_tuned_lens: every field is
type- and range-checked before any work, naming the field and the value typed; resumes are exact or refused."""
import copy
import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import interp
from interp.lens.settings import TunedLensSettings
from sprout import Sprout
from sprout.settings import Checked
from sprout.training.recipes import Recipe
from tests.conftest import TINY, randomize_gains


@dataclass(frozen=True)
class Toy(Checked):
    n: int = 1
    rate: float = 0.5
    name: str = "a"
    on: bool = False
    width: Optional[int] = None

    RANGES = {"n": (1, None, "["), "rate": (0, 1, "(]"), "name": {"a", "b"}, "width": (2, 8, "[]")}
    WHAT = "toy"


@pytest.mark.parametrize("field, value, words", [
    ("n", 0, "toy field n must be >= 1, got 0"), ("n", 2.0, "toy field n must be an integer, got 2.0"),
    ("n", True, "toy field n must be an integer, got True"), ("rate", 0, r"toy field rate must be in \(0, 1\], got 0"),
    ("rate", math.nan, "toy field rate must be a finite number, got nan"),
    ("rate", math.inf, "toy field rate must be a finite number, got inf"), ("rate", "0.5", "a finite number, got '0.5'"),
    ("name", "c", "toy field name must be 'a' or 'b', got 'c'"), ("on", 1, "toy field on must be true or false, got 1"),
    ("width", 9, r"toy field width must be in \[2, 8\], got 9"),
    ("width", 3.0, "toy field width must be an integer or None, got 3.0"),
])
def test_every_field_is_checked_naming_it_and_the_value(field, value, words):
    with pytest.raises(ValueError, match=words):
        Toy(**{field: value})


def test_ints_are_numbers_none_is_optional_and_unknown_keys_are_refused():
    assert Toy(rate=1).rate == 1 and Toy(width=None).width is None and Toy(width=8).width == 8
    assert Toy.from_dict({"n": 3}) == Toy(n=3)
    assert Toy().override(n=4).n == 4
    with pytest.raises(ValueError, match=r"unknown toy keys \['nn'\]"):
        Toy.from_dict({"nn": 3})
    with pytest.raises(ValueError, match="toy must be a mapping"):
        Toy.from_dict(["n", 3])
    assert Toy(n=2).differences(Toy()) == ["n: was 1, now 2"]


def test_the_recipe_is_a_checked_settings_type_with_its_own_words():
    assert issubclass(Recipe, Checked)
    with pytest.raises(ValueError, match=r"recipe field grad_clip \(--grad-clip\) must be >= 0, got -1"):
        Recipe(grad_clip=-1)
    with pytest.raises(ValueError, match=r"recipe field lr \(--lr\) must be a finite number, got nan"):
        Recipe(lr=math.nan)


# --- train_tuned_lens ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_gains(Sprout(TINY).eval())


def ids(seed=3, shape=(12, 16)):
    return torch.randint(0, TINY.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def train(model, data=None, **kw):
    return interp.train_tuned_lens(model, ids() if data is None else data, **{"steps": 3, "batch_size": 4,
                                                                                "progress": False, **kw})


@pytest.mark.parametrize("field, value, words", [
    ("grad_clip", -1.0, r"grad_clip must be a finite number >= 0 \(0: no clipping\), got -1.0"),
    ("grad_clip", math.nan, "grad_clip must be a finite number >= 0 .*, got nan"),
    ("grad_clip", math.inf, "grad_clip must be .*, got inf"),
    ("lr", 0.0, "lr must be a finite number > 0, got 0.0"), ("lr", -1, "lr must be a finite number > 0, got -1"),
    ("lr", math.nan, "lr must be a finite number > 0, got nan"), ("lr", "1", "lr must be a finite number > 0, got '1'"),
    ("momentum", 1.0, r"momentum must be a number in \[0, 1\), got 1.0"),
    ("momentum", -0.1, r"momentum must be a number in \[0, 1\), got -0.1"),
    ("weight_decay", -1e-3, "weight_decay must be a finite number >= 0, got -0.001"),
    ("steps", 2.0, "steps must be a positive int, got 2.0"), ("steps", 0, "steps must be a positive int, got 0"),
    ("batch_size", True, "batch_size must be a positive int, got True"),
    ("batch_size", 0, "batch_size must be a positive int, got 0"),
    ("seq_len", 3.5, "seq_len must be a positive int or None, got 3.5"),
    ("seed", -1, r"seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    ("stop_at", 1.5, "stop_at must be an integer >= 0 or None, got 1.5"),
])
def test_bad_settings_are_refused_before_any_work(model, field, value, words):
    with pytest.raises(ValueError, match="train_tuned_lens: " + words):
        interp.train_tuned_lens(model, None, **{field: value})  # data None would fail later: settings come first
    with pytest.raises(ValueError, match="train_tuned_lens: " + words):
        TunedLensSettings(**{field: value})


def test_grad_clip_zero_means_no_clipping(model):
    free = train(model, grad_clip=0)
    huge = train(model, grad_clip=1e30)  # a bound never reached: the same steps as no clipping
    tight = train(model, grad_clip=1e-4)
    for a, b in zip(free.parameters(), huge.parameters()):
        assert torch.equal(a, b)
    assert any(p.abs().max() > 0 for p in free.parameters())  # the lens learned (a clip to 0 would leave it at 0)
    assert not all(torch.equal(a, b) for a, b in zip(free.parameters(), tight.parameters()))
    assert free.info["recipe"]["grad_clip"] == 0


def test_momentum_zero_is_plain_sgd(model):
    lens = train(model, momentum=0.0)
    assert lens.info["recipe"]["optimizer"] == "SGD" and lens.step == 3


@pytest.mark.parametrize("change, words", [
    (dict(steps=7), "steps: lens has 6, now 7"), (dict(seed=1), "seed: lens has 0, now 1"),
    (dict(batch_size=2), "batch_size: lens has 4, now 2"), (dict(lr=0.5), "lr: lens has 1.0, now 0.5"),
    (dict(grad_clip=0), "grad_clip: lens has 1.0, now 0"), (dict(seq_len=8), "seq_len: lens has 64, now 8"),
    (dict(data=ids(seed=4)), "data: lens has '3 windows of 64 tokens, sha256 [0-9a-f]{16}', now '3 windows of 64 tokens, sha256"),
])
def test_a_resume_with_another_schedule_or_data_is_refused(model, change, words):
    part = train(model, steps=6, stop_at=3)
    before = copy.deepcopy(part.state_dict())
    kw = {"steps": 6, **change}
    with pytest.raises(ValueError, match=r"cannot resume this lens at step 3: the settings differ .*" + words.replace("(", r"\(")):
        train(model, lens=part, **kw)
    assert part.step == 3 and all(torch.equal(before[k], v) for k, v in part.state_dict().items())


def test_a_saved_lens_restarts_the_schedule_and_says_so(model, tmp_path):
    part = train(model, steps=6, stop_at=3)
    part.save(tmp_path / "lens")
    loaded = interp.TunedLens.load(model, tmp_path / "lens")
    assert loaded.step == 3 and loaded.optimizer_state is None
    with pytest.warns(RuntimeWarning, match="carries no optimizer state .* restarts the schedule at step 0"):
        again = train(model, steps=6, lens=loaded)
    fresh = interp.TunedLens.load(model, tmp_path / "lens")
    fresh.step = 0  # the same translators as a new schedule's start: what the restart promised
    expected = train(model, steps=6, lens=fresh)
    assert again.step == 6
    for a, b in zip(again.parameters(), expected.parameters()):
        assert torch.equal(a, b)


def test_held_out_data_is_checked_before_training(model, monkeypatch):
    import interp.lens.train as trainer

    def no_step(*args, **kwargs):
        raise AssertionError("trained before checking held_out")
    monkeypatch.setattr(trainer, "lens_step", no_step)
    with pytest.raises(TypeError, match="token ids must be an integer tensor"):
        train(model, held_out=ids().float())
