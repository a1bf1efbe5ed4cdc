"""Peer run: our tuned lens beside the `tuned-lens` package's, on the Hugging Face export of a demo.

Both train on the same text for the same steps and tokens per step; both are then scored on the same
held-out windows (KL(final output || lens) per layer, computed the same way), and both trainings are timed.
Needs the `tuned-lens` package importable (a separate venv, never the global environment):

    python3 -m venv /tmp/tlvenv --system-site-packages
    /tmp/tlvenv/bin/pip install tuned-lens && /tmp/tlvenv/bin/pip install --no-deps torchdata==0.8.0
    PYTHONPATH=$PWD /tmp/tlvenv/bin/python -m benchmarks.tuned_lens_peer --out /tmp/peer [--steps 400]

(torchdata 0.11, what pip picks, no longer has the `dataloader2` module tuned-lens 0.2.0 imports.)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
from interp._core.batching import batches, token_rows  # noqa: E402
from interp.lens.train import model_text  # noqa: E402
from sprout.files import load  # noqa: E402
from sprout.files.hf import export  # noqa: E402

# tuned-lens 0.2.0 passes load_in_8bit=False to from_pretrained, which transformers 5 no longer accepts:
# drop that one keyword (False means no 8-bit). It also probes TransformerLens' HookedTransformer, which
# TransformerLens 4 removed (importing it raises): tell it TransformerLens is absent (these are HF models).
# And it predates Qwen3: it finds the final norm and the layers of a Llama by `isinstance(m, LlamaModel)`;
# a Qwen3Model keeps them under the same names (`norm`, `layers`), so it is let through that test.
# Its command line runs unchanged otherwise.
SHIM = """
import transformers.models.llama.modeling_llama as llama
import transformers.models.qwen3.modeling_qwen3 as qwen3
import tuned_lens.model_surgery
tuned_lens.model_surgery._transformer_lens_available = False
llama.LlamaModel = (llama.LlamaModel, qwen3.Qwen3Model)
"""
LAUNCH = SHIM + """
import sys, transformers
from tuned_lens.__main__ import main
_load = transformers.AutoModelForCausalLM.from_pretrained
def from_pretrained(*a, load_in_8bit=False, **kw):
    assert not load_in_8bit
    return _load(*a, **kw)
transformers.AutoModelForCausalLM.from_pretrained = from_pretrained
main(sys.argv[1:])
"""


def train_theirs(hf_dir: Path, data: Path, out: Path, steps: int, batch: int, seq_len: int) -> float:
    cmd = [sys.executable, "-c", LAUNCH, "train", "--model.name", str(hf_dir), "--data.name", str(data),
           "--max_length", str(seq_len), "--precision", "float32", "--per_gpu_batch_size", str(batch), "--tokens_per_step",
           str(batch * seq_len), "--num_steps", str(steps), "--output", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    (out.parent / "theirs.log").write_text(run.stderr)
    if run.returncode:
        raise SystemExit(f"tuned-lens failed ({' '.join(cmd)}):\n{run.stderr[-4000:]}")
    return seconds, loop_seconds(run.stderr)


def loop_seconds(log: str) -> float:
    """Its training loop's own time, from the last "Training: ... [mm:ss<" of its progress bar."""
    found = re.findall(r"Training: 100%.*?\[(\d+):(\d+)(?::(\d+))?<", log)
    if not found:
        return float("nan")
    a, b, c = found[-1]
    return int(a) * 60 + int(b) if not c else int(a) * 3600 + int(b) * 60 + int(c)


@torch.inference_mode()
def their_kl(hf_dir: Path, lens_dir: Path, model, held_out: str) -> list[float]:
    """Mean KL(final || their lens) per layer on the windows `lens_comparison` scores ours on."""
    from transformers import AutoModelForCausalLM
    exec(SHIM)  # see SHIM
    from tuned_lens.nn.lenses import TunedLens as TheirLens


    hf = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    lens = TheirLens.from_model_and_pretrained(hf, str(lens_dir)).eval()
    total, n = None, 0
    for _, ids in batches(token_rows(model, held_out), 8):
        out = hf(ids, output_hidden_states=True)
        log_p = torch.log_softmax(out.logits.float(), -1)
        kls = [(log_p.exp() * (log_p - torch.log_softmax(lens(h, idx=i).float(), -1))).sum(-1).sum().item()
               for i, h in enumerate(out.hidden_states[:-1])]
        total = kls if total is None else [a + b for a, b in zip(total, kls)]
        n += ids.numel()
    return [t / n for t in total] + [0.0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-4")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--train-chars", type=int, default=1_200_000)
    ap.add_argument("--held-out-chars", type=int, default=60_000)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load(args.model)
    hf_dir = out / "hf"
    if not hf_dir.exists():
        export(model, hf_dir)
    text, held_out = model_text(args.train_chars), interp.held_out_stories(args.held_out_chars)
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps({"text": s}) + "\n" for s in text.split("\n\n")))
    seq_len = int(model.cfg.n_ctx)

    theirs_s, theirs_loop = train_theirs(hf_dir, data, out / "theirs", args.steps, args.batch, seq_len)
    t0 = time.perf_counter()
    ours = interp.train_tuned_lens(model, text, steps=args.steps, batch_size=args.batch, progress=False)
    ours_s = time.perf_counter() - t0
    cmp = interp.lens_comparison(model, held_out, ours)
    mine = cmp[cmp.lens == "tuned"].kl_to_final.tolist()
    logit = cmp[cmp.lens == "logit"].kl_to_final.tolist()
    theirs = their_kl(hf_dir, out / "theirs", model, held_out)
    rows = [dict(layer=l, logit=a, ours=b, theirs=c, ratio=b / c if c else float("nan"))
            for l, (a, b, c) in enumerate(zip(logit, mine, theirs))]
    result = dict(model=args.model, steps=args.steps, tokens_per_step=args.batch * seq_len, threads=torch.get_num_threads(),
                  ours_seconds=ours_s, ours_loop_seconds=ours.info["train_seconds"], theirs_seconds=theirs_s,
                  theirs_loop_seconds=theirs_loop, layers=rows)
    (out / "peer.json").write_text(json.dumps(result, indent=1))
    print(f"{args.model}, {args.steps} steps x {args.batch * seq_len} tokens, {torch.get_num_threads()} threads")
    print(f"training, data preparation included: ours {ours_s:.1f} s, tuned-lens {theirs_s:.1f} s (with its start-up)")
    print(f"training loop alone: ours {ours.info['train_seconds']:.1f} s, tuned-lens {theirs_loop:.1f} s (its progress bar)")
    print("layer  logit KL  ours KL  theirs KL  ours/theirs")
    for r in rows:
        print(f"{r['layer']:>5}  {r['logit']:8.3f}  {r['ours']:7.3f}  {r['theirs']:9.3f}  {r['ratio']:11.3f}")
    return result


if __name__ == "__main__":
    main()
