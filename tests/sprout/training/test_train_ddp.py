"""DistributedDataParallel: two CPU processes under torchrun (gloo) end with identical weights."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from sprout.training import train
from sprout.training.recipes import get_recipe

ROOT = Path(__file__).resolve().parents[3]
RECIPE = get_recipe("tiny").override(max_steps=6, ckpt_every=3, eval_every=3)

SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from safetensors.torch import save_file
    from sprout.training.recipes import Recipe
    from sprout.training import train
    torch.set_num_threads(1)
    out, cache, recipe = sys.argv[1], sys.argv[2], Recipe.from_dict(eval(sys.argv[3]))
    model = train(recipe, out, data_cache=cache, progress=False)
    rank = os.environ.get("RANK", "solo")
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"},
              f"{out}/weights-{rank}.safetensors")
""")


def test_two_processes_hold_identical_weights_after_training(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    cache, ddp, solo = tmp_path / "cache", tmp_path / "ddp", tmp_path / "solo"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the single-process run, here (a process of its own would only import torch again), builds the data
    # cache the two processes then share
    alone = {k: v for k, v in train(RECIPE, solo, data_cache=cache, progress=False).state_dict().items()}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(ddp), str(cache), repr(RECIPE.to_dict())], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]

    w0, w1 = load_file(str(ddp / "weights-0.safetensors")), load_file(str(ddp / "weights-1.safetensors"))
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    saved = load_file(str(ddp / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert all(torch.equal(w0[k], saved[k]) for k in saved)
    # each rank drew its own batches, so the averaged gradients differ from one process's
    assert not torch.equal(w0["embed.weight"], alone["embed.weight"])
    state = torch.load(ddp / "checkpoints" / "step_00000006" / "trainer.pt", weights_only=True)
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["batch"], state["rng"][1]["batch"])
