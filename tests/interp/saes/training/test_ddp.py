"""train_sae / train_transcoder under torchrun: two CPU processes (gloo), each harvesting its own share of
every batch, train the same dictionaries as one process (BatchTopK's batch-wide cut, AuxK's dead
latents, JumpReLU's steered coefficient and the geometric-median start all computed over both)."""
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

ROOT = Path(__file__).resolve().parents[4]

SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from safetensors.torch import save_file
    from tests.interp.saes.training.test_ddp import train_all
    torch.set_num_threads(1)
    out = train_all()
    save_file(out, f"{sys.argv[1]}/sae-{os.environ['RANK']}.safetensors")
""")


def train_all() -> dict:
    """Three runs (two SAEs from one forward, a skip transcoder, a JumpReLU on a tensor); their weights."""
    torch.manual_seed(0)
    model = randomize_gains(Sprout(TINY).eval())
    ids = torch.randint(0, 256, (12, 64), generator=torch.Generator().manual_seed(1))
    acts = torch.randn(2000, 16, generator=torch.Generator().manual_seed(2)) * 3
    quick = dict(d_sae=32, steps=6, batch_size=128, progress=False, dead_tokens=256)
    out = {}
    saes = interp.train_sae(model, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], data=ids,
                            kind="batchtopk", k=4, buffer_tokens=512, **quick)
    out.update({f"b{i}.{k}": v for i, s in enumerate(saes.values()) for k, v in s.state_dict().items()})
    tc = interp.train_transcoder(model, ids, 1, kind="topk", k=4, skip=True, buffer_tokens=512, **quick)
    out.update({f"tc.{k}": v for k, v in tc.state_dict().items()})
    jr = interp.train_sae(acts, kind="jumprelu", k=3, **quick)
    out.update({f"jr.{k}": v for k, v in jr.state_dict().items()})
    return {k: v.detach().contiguous() for k, v in out.items()}


def test_two_processes_equal_one_process(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = train_all()  # one process: this one
    r0, r1 = (load_file(str(tmp_path / f"sae-{r}.safetensors")) for r in ("0", "1"))
    assert set(r0) == set(one) and all(torch.equal(r0[k], r1[k]) for k in one)
    assert one["tc.W_skip"].abs().sum() > 0 and one["b0.threshold"].abs().sum() > 0
    for k in one:
        assert torch.allclose(r0[k], one[k], atol=1e-5, rtol=1e-4), k
