"""The trainers' shared core: the gradient reduction, clipping, the resume check, the dictionaries' Adam
(against torch's) and the settings-to-flags rule."""
import argparse
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
import torch.distributed as dist

from sprout.settings import Checked
from sprout.training.core import Adam, add_settings_flags, clip_grads, reduce_grads, resume_changes, set_lr, settings_from_flags
from sprout.training.recipes import get_recipe


def _params(*grads):
    """Parameters holding `grads` (None: a parameter of shape [2] without a gradient)."""
    out = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(2) if g is None else torch.zeros_like(g))
        p.grad = None if g is None else g.clone()
        out.append(p)
    return out


def test_reduce_grads_is_the_identity_on_one_process():
    ps = _params(torch.tensor([1.0, 2.0]), torch.tensor([[3.0]]))
    reduce_grads(ps, world=1)
    assert torch.equal(ps[0].grad, torch.tensor([1.0, 2.0])) and torch.equal(ps[1].grad, torch.tensor([[3.0]]))


def test_reduce_grads_sums_over_the_group_then_divides_by_the_world(tmp_path):
    """In a gloo group of one process the all-reduce's sum is the process's own gradient: the mean over a
    world of 2 is then half of it, the sum all of it, every tensor back in its own shape; a parameter
    without a gradient takes part as zeros."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        g1, g2 = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([[6.0, 8.0]])
        ps = _params(g1, g2, None)
        reduce_grads(ps, world=2)
        assert torch.equal(ps[0].grad, g1 / 2) and torch.equal(ps[1].grad, g2 / 2)
        assert torch.equal(ps[2].grad, torch.zeros(2))
        ps = _params(g1, g2)
        reduce_grads(ps, world=2, mean=False)
        assert torch.equal(ps[0].grad, g1) and torch.equal(ps[1].grad, g2)
    finally:
        dist.destroy_process_group()


def test_clip_grads_scales_to_the_norm_and_zero_means_none():
    ps = _params(torch.tensor([3.0]), torch.tensor([4.0]))  # global norm 5
    assert clip_grads(ps, 1.0).item() == pytest.approx(5.0)
    assert torch.allclose(torch.cat([p.grad for p in ps]), torch.tensor([0.6, 0.8]), atol=1e-6)
    ps = _params(torch.tensor([3.0]), torch.tensor([4.0]))
    assert clip_grads(ps, 0.0).item() == pytest.approx(5.0)
    assert torch.equal(torch.cat([p.grad for p in ps]), torch.tensor([3.0, 4.0]))


def test_resume_changes_names_each_differing_field():
    run = get_recipe("tiny")
    assert resume_changes(run, run) == []
    assert resume_changes(run, run.override(lr=0.5, seed=9), was="run has") == [
        f"lr: run has {run.lr!r}, now 0.5", f"seed: run has {run.seed!r}, now 9"]
    assert resume_changes({"lr": 0.1, "gone": 1}, {"lr": 0.1}) == ["gone: was 1, now None"]
    assert resume_changes(run.to_dict(), run.override(batch_size=3)) == [f"batch_size: was {run.batch_size}, now 3"]


def test_the_dictionaries_adam_follows_torchs_adam():
    """Written out for the reasons its docstring gives, it must still be Adam: torch's within rounding."""
    torch.manual_seed(0)
    w = torch.randn(5, 3)
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    ours, theirs = Adam([a]), torch.optim.Adam([b], lr=0.0)
    for step in range(5):
        g = torch.randn(5, 3)
        a.grad, b.grad = g.clone(), g.clone()
        set_lr(ours, 0.01 * (step + 1))
        set_lr(theirs, 0.01 * (step + 1))
        ours.step()
        theirs.step()
        ours.zero_grad()
        assert a.grad is None
    assert torch.allclose(a, b, atol=1e-6) and not torch.equal(a, w)


@dataclass(frozen=True)
class Toy(Checked):
    width: int = 4  # columns of the toy
    rate: Optional[float] = None  # learning rate; None: the default
    name: str = "x"
    fast: bool = False  # skip the slow part
    sizes: Optional[tuple] = None  # a tuple: no flag

    RANGES = {"width": (1, None, "["), "rate": (0, 1, "(]"), "name": frozenset({"x", "y"})}


def test_settings_flags_are_generated_from_the_fields_and_their_comments():
    ap = argparse.ArgumentParser()
    add_settings_flags(ap, Toy, "toy")
    helps = {a.dest: a.help for a in ap._actions}
    assert helps["width"] == "columns of the toy" and helps["fast"] == "skip the slow part"
    assert "sizes" not in helps
    args = ap.parse_args(["--width", "7", "--rate", "0.5", "--fast"])
    assert settings_from_flags(args, Toy) == {"width": 7, "rate": 0.5, "fast": True}
    assert Toy.from_dict(settings_from_flags(ap.parse_args([]), Toy)) == Toy()
    with pytest.raises(SystemExit):
        ap.parse_args(["--width", "2.5"])


@pytest.mark.parametrize("argv,words", [(["--width", "0"], "argument --width: expected a whole number >= 1, got 0"),
                                        (["--rate", "inf"], "argument --rate: expected a finite number"),
                                        (["--rate", "2"], "argument --rate: expected a finite number in (0, 1], got 2.0"),
                                        (["--name", "z"], "argument --name: expected 'x' or 'y', got 'z'")])
def test_with_ranges_a_flag_out_of_its_fields_range_is_a_usage_error(capsys, argv, words):
    ap = argparse.ArgumentParser()
    add_settings_flags(ap, Toy, "toy", ranges=True)
    assert ap.parse_args(["--width", "1", "--rate", "1", "--name", "y"]).rate == 1.0
    with pytest.raises(SystemExit) as err:
        ap.parse_args(argv)
    assert err.value.code == 2 and words in capsys.readouterr().err
