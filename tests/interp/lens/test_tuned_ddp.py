"""train_tuned_lens under torchrun: two CPU processes (gloo) take the same steps as one process."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

import interp
from sprout import Sprout
from tests.conftest import TINY, randomize_gains

ROOT = Path(__file__).resolve().parents[3]

def train_lens() -> dict:
    """The lens every process trains: the same model, data and seeds (one thread, as the test process)."""
    torch.manual_seed(0)
    model = randomize_gains(Sprout(TINY).eval())
    data = torch.randint(0, 256, (12, 64), generator=torch.Generator().manual_seed(1))
    return interp.train_tuned_lens(model, data, steps=4, batch_size=4, progress=False).state_dict()


SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from safetensors.torch import save_file
    from tests.interp.lens.test_tuned_ddp import train_lens
    torch.set_num_threads(1)
    save_file(train_lens(), f"{sys.argv[1]}/lens-{os.environ['RANK']}.safetensors")
""")


def test_two_processes_equal_one_process(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    state = torch.random.get_rng_state()
    try:
        one = train_lens()  # the single process is this one: a process of its own would only import torch again
    finally:
        torch.random.set_rng_state(state)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    r0, r1 = (load_file(str(tmp_path / f"lens-{r}.safetensors")) for r in ("0", "1"))
    assert all(torch.equal(r0[k], r1[k]) for k in one)
    assert any(one[k].abs().sum() > 0 for k in one)
    for k in one:
        assert torch.allclose(r0[k], one[k], atol=1e-6, rtol=1e-4), k
