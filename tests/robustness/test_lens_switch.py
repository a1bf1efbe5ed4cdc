"""A tuned lens' two files (weights, then the JSON that hashes them) switch as one (issue 36 item 4): a
process saving a lens is SIGKILLed after its first file lands, or before the switch commits, and the lens
then loads, new or old, never refused as a mix; the next save finishes or cleans up what was left."""
import os
import signal

import pytest
import torch

from interp.lens.tuned import TunedLens, load_tuned_lens
from sprout import Sprout
from tests.conftest import TINY


def lens_of(model, shift: float) -> TunedLens:
    lens = TunedLens(model)
    with torch.no_grad():
        for p in lens.parameters():
            p.add_(shift)
    return lens


def equal(a: TunedLens, b: TunedLens) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def save_killed(lens, path, die_at) -> None:
    """Save `lens` in a forked child that SIGKILLs itself at the os call `die_at` names ("replace": after the
    first file is moved into place; "rename": before any rename); wait for it."""
    pid = os.fork()
    if pid == 0:
        try:
            real = getattr(os, die_at)

            def then_die(a, b, *args, **kwargs):
                if die_at == "rename":
                    os.kill(os.getpid(), signal.SIGKILL)
                real(a, b, *args, **kwargs)
                if str(b).endswith(".safetensors"):
                    os.kill(os.getpid(), signal.SIGKILL)

            setattr(os, die_at, then_die)
            lens.save(path)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


@pytest.fixture(scope="module")
def model():
    return Sprout(TINY).eval()


def test_a_kill_between_the_two_files_leaves_the_new_lens(tmp_path, model):
    old, new = lens_of(model, 0.25), lens_of(model, 0.5)
    old.save(tmp_path)
    save_killed(new, tmp_path, "replace")
    assert equal(TunedLens.load(model, tmp_path), new)  # new weights in place, their JSON read where it waits
    assert equal(load_tuned_lens(model, tmp_path), new)
    newer = lens_of(model, 0.75)
    newer.save(tmp_path)  # finishes the killed switch first, then switches again
    assert equal(TunedLens.load(model, tmp_path), newer)
    assert sorted(os.listdir(tmp_path)) == ["tuned_lens.json", "tuned_lens.safetensors"]


def test_a_kill_before_the_switch_leaves_the_old_lens(tmp_path, model):
    old, new = lens_of(model, 0.25), lens_of(model, 0.5)
    path = tmp_path / "lens.safetensors"
    old.save(path)
    save_killed(new, path, "rename")
    assert equal(TunedLens.load(model, path), old)
    new.save(path)  # removes the killed save's staging folder
    assert equal(TunedLens.load(model, path), new)
    assert sorted(os.listdir(tmp_path)) == ["lens.json", "lens.safetensors"]
