"""An interrupted `experiments.ship` leaves a demo's dictionaries all old or all new (issue 36 item 4): a
child process writing a set with `experiments.ship_swap.write_set` is killed (SIGKILL) after its first
dictionary, or between the two renames of the fallback switch; every dictionary then loads, the old set
whole, and the next run recovers and writes the new set."""
import os
import signal

import pytest
import torch

import interp
from experiments import ship_swap

D, N = 8, 3


def saes(seed: int) -> list:
    return [interp.SAE(D, 16, kind="relu", hook_name=f"blocks.{i}.hook_resid_post", seed=seed + i) for i in range(N)]


def state(root) -> list:
    """The decoder of each dictionary in root/saes (None for a missing one)."""
    return [interp.SAE.load(root / "saes" / f"d{i}").W_dec if (root / "saes" / f"d{i}").is_dir() else None
            for i in range(N)]


def same(found: list, expected: list) -> bool:
    return all(f is not None and torch.equal(f, e.W_dec) for f, e in zip(found, expected))


def killed_child(job) -> None:
    """Run `job` in a forked child that SIGKILLs itself where the job says; wait for it."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            job()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


def ready(root, dictionaries) -> list:
    return [(s, root / "saes" / f"d{i}") for i, s in enumerate(dictionaries)]


def test_a_kill_after_the_first_dictionary_leaves_the_old_set_and_the_next_run_recovers(tmp_path, monkeypatch):
    old, new = saes(0), saes(10)
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, old))
    real = interp.SAE.save

    def save_then_die(self, folder):
        real(self, folder)
        os.kill(os.getpid(), signal.SIGKILL)

    def job():
        monkeypatch.setattr(interp.SAE, "save", save_then_die)
        ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new))

    killed_child(job)
    assert same(state(tmp_path), old)  # not one new dictionary beside old ones
    assert any(p.name.startswith(".saes.tmp-") for p in tmp_path.iterdir())  # the killed run's staging folder
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new))
    assert same(state(tmp_path), new) and sorted(os.listdir(tmp_path)) == ["saes"]


def test_a_kill_inside_the_fallback_switch_is_repaired_by_the_next_run(tmp_path, monkeypatch):
    """Without an atomic exchange the switch renames twice: killed between them, saes/ is missing until the
    next run, which puts the old set back (then writes the new one)."""
    old, new = saes(0), saes(10)
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, old))
    real = os.rename

    def rename_then_die(a, b):
        real(a, b)
        if ".old-" in str(b):
            os.kill(os.getpid(), signal.SIGKILL)

    def job():
        monkeypatch.setattr(ship_swap, "exchange", lambda a, b: False)
        monkeypatch.setattr(ship_swap.os, "rename", rename_then_die)
        ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new))

    killed_child(job)
    assert not (tmp_path / "saes").exists()
    with pytest.warns(UserWarning, match="previous dictionaries are back"):
        ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new[:1]))
    assert same(state(tmp_path), new[:1] + old[1:]) and sorted(os.listdir(tmp_path)) == ["saes"]


def test_a_partial_set_keeps_the_other_dictionaries(tmp_path):
    """--layers / --parts: the dictionaries not written stay as they were (linked into the new set)."""
    old, new = saes(0), saes(10)
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, old))
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new)[1:2])
    assert same(state(tmp_path), [old[0], new[1], old[2]])
    with pytest.raises(ValueError, match="not a dictionary folder"):
        ship_swap.write_set(tmp_path / "saes", [(new[0], tmp_path / "elsewhere" / "d0")])


def test_ctrl_c_after_the_first_dictionary_leaves_the_old_set_and_no_staging(tmp_path, monkeypatch):
    old, new = saes(0), saes(10)
    ship_swap.write_set(tmp_path / "saes", ready(tmp_path, old))
    real = interp.SAE.save

    def save_then_interrupt(self, folder):
        real(self, folder)
        raise KeyboardInterrupt

    monkeypatch.setattr(interp.SAE, "save", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ship_swap.write_set(tmp_path / "saes", ready(tmp_path, new))
    assert same(state(tmp_path), old) and sorted(os.listdir(tmp_path)) == ["saes"]
