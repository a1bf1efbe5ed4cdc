"""A process group only when asked (issue 36, bad case 9 and item 5): a stray WORLD_SIZE=2 without
torchrun's other variables fails at once, naming them, instead of waiting 30 minutes on a rendezvous."""
import time

import pytest
import torch
import torch.distributed as dist

import interp
from interp._core.distributed import join, requested, world_and_rank

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}


def test_a_stray_world_size_fails_at_once_naming_what_is_missing(monkeypatch):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2 is set but RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT is not"):
        interp.train_sae(torch.randn(64, 4), kind="topk", d_sae=8, k=2, steps=2, batch_size=32, progress=False)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("env, asked", [
    ({}, False), ({"WORLD_SIZE": "1"}, False), (TORCHRUN, True),
    ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "", "SPROUT_DISTRIBUTED": "1"}, True)])
def test_what_asks_for_a_process_group(env, asked):
    assert requested(env) is asked


@pytest.mark.parametrize("env, words", [
    ({**TORCHRUN, "TORCHELASTIC_RUN_ID": ""}, "TORCHELASTIC_RUN_ID"),
    ({**TORCHRUN, "RANK": "2"}, "inconsistent"),
    ({**TORCHRUN, "LOCAL_RANK": "-1"}, "inconsistent"),
    ({**TORCHRUN, "WORLD_SIZE": "two"}, "not an integer")])
def test_incomplete_or_inconsistent_variables_are_named(env, words):
    with pytest.raises(RuntimeError, match=words):
        requested(env)


def test_sprout_train_refuses_a_stray_world_size_too(monkeypatch):
    from sprout.training.loop import _distributed
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="not a torchrun launch"):
        _distributed()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _distributed() == (1, 0)


def test_a_query_for_the_world_size_starts_no_process_group(monkeypatch):
    """`world_and_rank` answers from the launch's variables; only a trainer's `join` starts a group."""
    started = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: started.append(k))
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert not dist.is_initialized()
    assert world_and_rank() == (2, 1)
    assert started == [] and not dist.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert world_and_rank() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    join()  # the trainers' call: the group is started here (patched out: nothing else listens)
    assert len(started) == 1 and started[0]["timeout"].total_seconds() > 0
