"""Who we are under torchrun, for every trainer here (`sprout train`, the tuned lens, the dictionaries).

A process group is joined only by `join()`, which each trainer calls once at its start (`world_and_rank`
is a query and starts nothing), and only when asked: torchrun's own variables all present and consistent
(WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID, which torchrun sets),
or the same variables with SPROUT_DISTRIBUTED=1 for another launcher. A stray WORLD_SIZE > 1 without
them fails at once, naming what is missing, instead of waiting on a rendezvous no other process joins;
the rendezvous itself waits RENDEZVOUS_S seconds (SPROUT_RENDEZVOUS_S), not torch's 30 minutes.
"""
from __future__ import annotations

import atexit
import os
from datetime import timedelta
from typing import Mapping

import torch.distributed as dist

REQUIRED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
RENDEZVOUS_S = 300


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise RuntimeError(f"{name}={env[name]!r} is not an integer: the process group's variables are torchrun's "
                           "(launch with torchrun, or unset them for one process)") from None


def requested(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for a process group: WORLD_SIZE > 1 with torchrun's variables complete and
    consistent. A WORLD_SIZE > 1 without them is an error (see the module), WORLD_SIZE 1 or absent is not asked."""
    if "WORLD_SIZE" not in env or _int(env, "WORLD_SIZE") <= 1:
        return False
    world = _int(env, "WORLD_SIZE")
    missing = [n for n in REQUIRED if not env.get(n)]
    launched = bool(env.get("TORCHELASTIC_RUN_ID")) or env.get("SPROUT_DISTRIBUTED") == "1"
    if missing or not launched:
        what = ", ".join(missing) if missing else "TORCHELASTIC_RUN_ID (or SPROUT_DISTRIBUTED=1)"
        raise RuntimeError(f"WORLD_SIZE={world} is set but {what} is not: this is not a torchrun launch, and a process "
                           "group would wait for processes that never come. Unset WORLD_SIZE to train in one process, "
                           "or launch with torchrun --nproc_per_node=N")
    rank, local = _int(env, "RANK"), _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
    if not (0 <= rank < world and 0 <= local < local_world <= world):
        raise RuntimeError(f"inconsistent torchrun variables: RANK={rank}, LOCAL_RANK={local}, "
                           f"LOCAL_WORLD_SIZE={local_world}, WORLD_SIZE={world} (need 0 <= RANK < WORLD_SIZE and "
                           "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE)")
    return True


def join() -> tuple[int, int]:
    """Join torchrun's process group (gloo) if the environment asks for one (`requested`) and it is not
    joined yet; returns (processes, this one's rank). The one call that starts a group: each trainer makes
    it once, at its start; everything else asks `world_and_rank`."""
    if not dist.is_initialized() and requested():
        wait = _int(os.environ, "SPROUT_RENDEZVOUS_S") if os.environ.get("SPROUT_RENDEZVOUS_S") else RENDEZVOUS_S
        dist.init_process_group("gloo", timeout=timedelta(seconds=wait))
        # left to the interpreter's teardown, gloo's threads can die joinable: "terminate called without an
        # active exception" and a non-zero exit after the work is done (seen in 1 of 3 two-process runs)
        atexit.register(_leave)
    return world_and_rank()


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world_and_rank() -> tuple[int, int]:
    """(processes, this one's rank), a query that starts nothing: the joined group's, else what a torchrun
    launch says (WORLD_SIZE, RANK) before `join`, else (1, 0)."""
    if dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    if requested():
        return _int(os.environ, "WORLD_SIZE"), _int(os.environ, "RANK")
    return 1, 0
