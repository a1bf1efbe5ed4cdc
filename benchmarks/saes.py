"""Dictionary learning, side by side in one run: training beside its FLOP floor, harvesting beside a bare
forward, and (where installed) SAELens' trainer and loader on the same activations.

- training: `interp.train_sae` on a tensor of activations (TopK, AuxK), tokens per second, beside the
  floor: the dense matmuls a step cannot avoid, timed alone on the same shapes: the encoder
  [B, d] x [d, s] and decoder [B, s] x [s, d] forward, and backward the decoder's input and weight
  gradients and the encoder's weight gradient (5 matmuls of B*d*s multiply-adds; the encoder's input
  needs no gradient);
- harvesting: the activation source `train_sae` reads from a model (buffered blocks, `stop_at_layer`,
  `run_with_cache_into`) beside a bare `model(ids, stop_at_layer=L)` on the same windows;
- SAELens (a separate venv; `python -m venv /work/venvs/saelens && pip install torch==2.13.0 sae-lens`):
  its `SAETrainer` with a TopK training SAE on the same activations, same d_sae, k, batch, steps, lr, AuxK
  coefficient and no activation normalisation; both SAEs scored by the same code on the same held-out
  activations; and `sae_lens.SAE.load_from_disk` on a folder we saved, its reconstruction compared to ours.

    python -m benchmarks.saes [--model gpt-4] [--steps 300] [--threads 1] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
from benchmarks.run import interleaved  # noqa: E402
from interp.data import model_text  # noqa: E402
from interp.saes.training.harvest import ModelSource  # noqa: E402
from sprout import Sprout, SproutConfig  # noqa: E402
from sprout.files import load  # noqa: E402
from sprout.names import act_name  # noqa: E402

SAELENS = Path(os.environ.get("SAELENS_PYTHON", "/work/venvs/saelens/bin/python"))
TARGETS = {"train": 0.60, "harvest": 0.90, "peer": 0.02}

# Runs in SAELens' venv (torch + sae_lens, none of our packages): argv = activations.safetensors, settings
# JSON, output folder. Trains, saves the trained SAE in SAELens' inference layout, prints its loop seconds.
PEER_TRAIN = r"""
import json, sys, time, torch
from safetensors.torch import load_file
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.config import SAETrainerConfig, LoggingConfig
from sae_lens.training.sae_trainer import SAETrainer
s = json.loads(sys.argv[2]); torch.set_num_threads(s["threads"]); torch.manual_seed(s["seed"])
acts = load_file(sys.argv[1])["acts"]
cfg = TopKTrainingSAEConfig(d_in=acts.shape[1], d_sae=s["d_sae"], k=s["k"], aux_loss_coefficient=s["aux"],
                            apply_b_dec_to_input=True, normalize_activations="none")
sae = TopKTrainingSAE(cfg)
g = torch.Generator().manual_seed(s["seed"])
def batches():
    while True:
        for idx in torch.randperm(len(acts), generator=g).split(s["batch"]):
            if len(idx) == s["batch"]:
                yield acts[idx]
tcfg = SAETrainerConfig(total_training_samples=s["steps"] * s["batch"], train_batch_size_samples=s["batch"], lr=s["lr"],
                        lr_end=0.0, lr_warm_up_steps=s["warmup"], lr_decay_steps=s["decay"], lr_scheduler_name="constant",
                        logger=LoggingConfig(log_to_wandb=False), dead_feature_window=1000, feature_sampling_window=2000)
trainer = SAETrainer(cfg=tcfg, sae=sae, data_provider=batches())
t0 = time.perf_counter(); sae = trainer.fit(); seconds = time.perf_counter() - t0
sae.save_inference_model(sys.argv[3])
print(json.dumps({"seconds": seconds}))
"""
# argv = folder we saved, activations.safetensors, output.safetensors: SAELens' reconstruction of them.
PEER_LOAD = r"""
import sys, torch
from safetensors.torch import load_file, save_file
from sae_lens import SAE
sae = SAE.load_from_disk(sys.argv[1], device="cpu")
x = load_file(sys.argv[2])["acts"]
with torch.no_grad():
    save_file({"recons": sae.decode(sae.encode(x)).contiguous(), "acts": sae.encode(x).contiguous()}, sys.argv[3])
print(type(sae).__name__)
"""


def harvest(model, hook: str, text: str) -> torch.Tensor:
    """Every activation at `hook` on the text's windows, [n, d]."""
    out = []
    with torch.inference_mode():
        for i, ids in enumerate(interp.data.stream_windows(model, text).split(16)):
            _, cache = model.run_with_cache(ids, names_filter=hook, stop_at_layer=int(hook.split(".")[1]) + 1)
            out.append(cache[hook].reshape(-1, cache[hook].shape[-1]))
    return torch.cat(out)


def ev_l0(sae, x: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        f = sae.encode(x)
        r = sae.decode(f)
    return float(1 - (x - r).pow(2).sum() / (x - x.mean(0)).pow(2).sum()), float((f != 0).sum(-1).float().mean())


def train_rows(acts, held, s: dict, repeats: int) -> dict:
    """Ours (train_sae on the tensor) beside the floor's matmuls, interleaved."""
    B, d, n = s["batch"], acts.shape[1], s["d_sae"]
    g = torch.Generator().manual_seed(0)
    x, W_enc, W_dec = torch.randn(B, d, generator=g), torch.randn(d, n, generator=g), torch.randn(n, d, generator=g)
    gy, f = torch.randn(B, d, generator=g), torch.randn(B, n, generator=g)
    box = {}

    def floor():
        for _ in range(s["steps"]):
            x @ W_enc, f @ W_dec  # forward: encoder, decoder
            gy @ W_dec.T, f.T @ gy, x.T @ (gy @ W_dec.T)  # backward: into the latents, W_dec's, W_enc's gradient

    def ours():
        box["sae"] = interp.train_sae(acts, "bench", kind="topk", d_sae=n, k=s["k"], steps=s["steps"], batch_size=B,
                                      lr=s["lr"], aux_k_coefficient=s["aux"], progress=False, normalize=False,
                                      warmup_steps=s["warmup"], decay_fraction=s["decay"] / s["steps"])

    t = interleaved({"floor": floor, "ours": ours}, repeats)
    tokens = s["steps"] * B
    ev, l0 = ev_l0(box["sae"], held)
    return dict(floor=tokens / t["floor"][0], ours=tokens / t["ours"][0], floor_cpu=tokens / t["floor"][1],
                ours_cpu=tokens / t["ours"][1], ours_seconds=t["ours"][0], ev=ev, l0=l0, sae=box["sae"])


def harvest_rows(model, hook: str, text: str, repeats: int) -> dict:
    layer = int(hook.split(".")[1])
    src = ModelSource(model, text, [hook], 1024, 0, None, 16, 1 << 15)
    ids = src.windows[: src.per_block]

    def bare():
        with torch.inference_mode():
            for i in range(0, len(ids), 16):
                model(ids[i:i + 16], stop_at_layer=layer + 1)

    t = interleaved({"bare": bare, "ours": lambda: src._harvest(0)}, repeats)
    n = ids.numel()
    return dict(bare=n / t["bare"][0], ours=n / t["ours"][0], bare_cpu=n / t["bare"][1], ours_cpu=n / t["ours"][1])


def peer_rows(ours_sae, acts, held, s: dict) -> dict:
    """SAELens' trainer on the same activations and settings, and its loader on our folder."""
    if not SAELENS.is_file():
        return {"missing": f"no SAELens interpreter at {SAELENS} (set SAELENS_PYTHON)"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_file({"acts": acts.contiguous()}, tmp / "acts.safetensors")
        save_file({"acts": held.contiguous()}, tmp / "held.safetensors")
        t0 = time.perf_counter()
        run = subprocess.run([str(SAELENS), "-c", PEER_TRAIN, str(tmp / "acts.safetensors"), json.dumps(s), str(tmp / "theirs")],
                             capture_output=True, text=True)
        if run.returncode:
            return {"missing": f"SAELens' trainer failed: {run.stderr.strip().splitlines()[-1]}"}
        seconds, total = json.loads(run.stdout.strip().splitlines()[-1])["seconds"], time.perf_counter() - t0
        theirs = interp.SAE.load(tmp / "theirs")  # our loader reads SAELens' folders
        ours_sae.save(tmp / "ours")
        load = subprocess.run([str(SAELENS), "-c", PEER_LOAD, str(tmp / "ours"), str(tmp / "held.safetensors"),
                               str(tmp / "recons.safetensors")], capture_output=True, text=True)
        if load.returncode:
            return {"missing": f"sae_lens.SAE.load_from_disk failed on our folder: {load.stderr.strip().splitlines()[-1]}"}
        got = load_file(tmp / "recons.safetensors")
    with torch.no_grad():
        diff = float((got["recons"] - ours_sae(held)).abs().max())
        acts_diff = float((got["acts"] - ours_sae.encode(held)).abs().max())
    ev, l0 = ev_l0(theirs, held)
    return dict(seconds=seconds, total=total, ev=ev, l0=l0, load_class=load.stdout.strip(), recons_diff=diff,
                acts_diff=acts_diff, scale=float(held.abs().max()))


def report(name: str, s: dict, tr: dict, hv: dict, peer: dict) -> str:
    ok = lambda b: "yes" if b else "no"
    t_ratio, t_cpu = tr["ours"] / tr["floor"], tr["ours_cpu"] / tr["floor_cpu"]
    h_ratio, h_cpu = hv["ours"] / hv["bare"], hv["ours_cpu"] / hv["bare_cpu"]
    lines = [f"{name}, {s['hook']}: TopK d_sae {s['d_sae']}, k {s['k']}, batch {s['batch']}, {s['steps']} steps, lr {s['lr']}; "
             f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d %H:%M')}", "",
             "| what | tokens/s | CPU tokens/s | ratio (wall / CPU) | target | met |", "| --- | ---: | ---: | ---: | --- | --- |",
             f"| FLOP floor of a training step (5 matmuls of B x d x d_sae) | {tr['floor']:,.0f} | {tr['floor_cpu']:,.0f} "
             "| 1.00x | reference | |",
             f"| `interp.train_sae` on a tensor, whole run | {tr['ours']:,.0f} | {tr['ours_cpu']:,.0f} | {t_ratio:.2f} / {t_cpu:.2f} | "
             f">= {TARGETS['train']:.0%} of the floor | {ok(min(t_ratio, t_cpu) >= TARGETS['train'])} |",
             f"| bare forward, `stop_at_layer` | {hv['bare']:,.0f} | {hv['bare_cpu']:,.0f} | 1.00x | reference | |",
             f"| activation harvesting (train_sae's model source) | {hv['ours']:,.0f} | {hv['ours_cpu']:,.0f} | "
             f"{h_ratio:.2f} / {h_cpu:.2f} | >= {TARGETS['harvest']:.0%} of the bare forward | "
             f"{ok(min(h_ratio, h_cpu) >= TARGETS['harvest'])} |",
             ""]
    if "missing" in peer:
        lines.append(f"SAELens: not compared ({peer['missing']}).")
        return "\n".join(lines)
    rel_ev, rel_l0 = abs(tr["ev"] - peer["ev"]) / peer["ev"], abs(tr["l0"] - peer["l0"]) / max(peer["l0"], 1e-9)
    lines += ["| trainer, same activations and settings | loop seconds | held-out EV | L0 |", "| --- | ---: | ---: | ---: |",
              f"| ours (`interp.train_sae`) | {tr['ours_seconds']:.1f} | {tr['ev']:.4f} | {tr['l0']:.1f} |",
              f"| SAELens `SAETrainer` (TopK) | {peer['seconds']:.1f} | {peer['ev']:.4f} | {peer['l0']:.1f} |", "",
              f"Time (ours no slower): {ok(tr['ours_seconds'] <= peer['seconds'])} ({tr['ours_seconds'] / peer['seconds']:.2f}x); "
              f"EV / L0 within {TARGETS['peer']:.0%}: {ok(max(rel_ev, rel_l0) <= TARGETS['peer'])} "
              f"(EV {rel_ev:.1%} apart, L0 {rel_l0:.1%}).",
              f"`sae_lens.SAE.load_from_disk` on our saved folder gives a {peer['load_class']}; its reconstruction of the "
              f"held-out activations differs from ours by at most {peer['recons_diff']:.1e} (activations up to "
              f"{peer['scale']:.1f}), its latents by {peer['acts_diff']:.1e}."]
    return "\n".join(lines)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-4")
    ap.add_argument("--hook", default=None, help="default: the last block's hook_resid_post")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--train-chars", type=int, default=400_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model, for a smoke run")
    ap.add_argument("--no-peer", action="store_true", help="skip SAELens")
    ap.add_argument("--out", default=None, help="append the report to this Markdown file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        from sprout.material import generate_corpus
        from sprout.tokenizer import train_bpe
        torch.manual_seed(0)
        model = Sprout(SproutConfig(vocab_size=300, context=32, n_layer=2, n_head=2, d_model=32, d_ff=64),
                       train_bpe(generate_corpus(8_000, seed=3), vocab_size=300)).eval()
        args.train_chars, args.repeats = min(args.train_chars, 20_000), 1
    else:
        model = load(args.model).eval()
    hook = args.hook or act_name("resid_post", int(model.cfg.n_layers) - 1)
    d = int(model.cfg.d_model)
    s = dict(hook=hook, d_sae=4 * d, k=min(32, d // 2), batch=args.batch, steps=args.steps, lr=2e-3, aux=1 / 32,
             warmup=args.steps // 20, decay=args.steps // 5, seed=0, threads=torch.get_num_threads())
    text = model_text(args.train_chars)
    acts, held = harvest(model, hook, text), harvest(model, hook, interp.held_out_stories(args.train_chars // 10))
    scale = d ** 0.5 / float(acts.norm(dim=-1).mean())  # both trainers see inputs of mean norm sqrt(d), unscaled inside
    acts, held = acts * scale, held * scale
    tr = train_rows(acts, held, s, args.repeats)
    hv = harvest_rows(model, hook, text, args.repeats)
    peer = {"missing": "--no-peer"} if args.no_peer else peer_rows(tr["sae"], acts, held, s)
    out = report("tiny" if args.tiny else args.model, s, tr, hv, peer)
    print(out)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + out + "\n")
    return out


if __name__ == "__main__":
    main()
