"""Scoring every edge of the gpt-4 demo: EAP and EAP-IG beside exact patching of every edge (the reference).

The task is induction on repeated random tokens: clean [A A], corrupted [B C] (no repeat to copy), the
metric the mean log probability of the right next token over the second half, resample ablation.
Exact patching runs one patched copy of the batch per edge (309 of them on gpt-4, batched into a few
forwards); EAP runs one forward and one backward; EAP-IG `steps` of each (inputs), or `steps` per layer
group (activations). Each row's median wall time over interleaved rounds is divided by exact
patching's from the same rounds; beside it, how well the ranking agrees with exact patching (Pearson r of
the scores, and the share of exact patching's top 5% of edges that the method also puts in its top 5%).
No time is asserted anywhere. auto-circuit and the EAP-IG package are not timed: neither installs and runs
on a Sprout (the errors are in benchmarks/RESULTS.md, "Peer packages").

    nice python -m benchmarks.discovery [--repeats 3] [--steps 5] [--tiny] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

import sprout
from interp.discovery import edge_scores
from sprout import Sprout, SproutConfig

TINY = SproutConfig(vocab_size=128, context=64, n_layer=2, n_head=3, d_model=48, d_ff=64)


def induction_task(vocab: int, n_seqs: int, half: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Callable]:
    """Clean [A A], corrupted [B C] of random tokens, and the mean log-prob of the right next token over the second half."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, vocab, (n_seqs, half), generator=g)
    clean = torch.cat([first, first], dim=1)
    corrupted = torch.randint(0, vocab, (n_seqs, 2 * half), generator=g)
    target = clean[:, half + 1:]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, half:-1].log_softmax(-1).gather(-1, target[..., None]).mean()
    return clean, corrupted, metric


def measure(model: Any, task: tuple, methods: dict[str, dict], repeats: int) -> tuple[dict, dict]:
    """Median seconds and the last scores [edge] of each method, the rounds interleaved."""
    clean, corrupted, metric = task
    times: dict[str, list[float]] = {k: [] for k in methods}
    scores: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, kwargs in methods.items():
            start = time.perf_counter()
            frame = edge_scores(model, clean, corrupted, metric, **kwargs)
            times[name].append(time.perf_counter() - start)
            scores[name] = frame["score"].to_numpy()
    return {k: statistics.median(v) for k, v in times.items()}, scores


def agreement(scores: np.ndarray, exact: np.ndarray, top: float = 0.05) -> tuple[float, float]:
    """(Pearson r with exact, share of exact's top `top` edges by |score| also in the method's top)."""
    n = max(1, math.ceil(top * len(exact)))
    best = set(np.argsort(-np.abs(exact))[:n])
    ours = set(np.argsort(-np.abs(scores))[:n])
    return float(np.corrcoef(scores, exact)[0, 1]), len(best & ours) / n


def table(name: str, n_edges: int, task: tuple, times: dict, scores: dict, steps: int) -> str:
    clean = task[0]
    labels = {"exact": "exact patching of every edge (the reference)", "eap": "EAP (1 forward + 1 backward)",
              "eap-ig-inputs": f"EAP-IG, inputs, {steps} steps", "eap-ig-activations": f"EAP-IG, activations, {steps} steps"}
    lines = [f"Every edge of {name} ({n_edges} edges), induction on repeated random tokens, batch "
             f"{clean.size(0)} x {clean.size(1)}, resample ablation; medians of interleaved rounds.", "",
             "| what | wall | ratio to exact | Pearson r with exact | exact's top 5% found |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for key, label in labels.items():
        r, found = agreement(scores[key], scores["exact"])
        lines.append(f"| {label} | {times[key]:.2f} s | {times[key] / times['exact']:.3f}x | {r:.3f} | {found:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m benchmarks.discovery", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    p.add_argument("--seqs", type=int, default=8, help="sequences in the batch")
    p.add_argument("--half", type=int, default=16, help="tokens in each half of a sequence")
    p.add_argument("--tiny", action="store_true", help="a tiny random model instead of the gpt-4 demo (smoke test)")
    p.add_argument("--out", default=None, help="append the table to this markdown file")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = Sprout(TINY).eval() if args.tiny else sprout.load("gpt-4")
    name = "a tiny random Sprout" if args.tiny else "the gpt-4 demo"
    task = induction_task(int(model.cfg.d_vocab), args.seqs, args.half)
    methods = {"exact": {"method": "exact"}, "eap": {"method": "eap"},
               "eap-ig-inputs": {"method": "eap-ig-inputs", "steps": args.steps},
               "eap-ig-activations": {"method": "eap-ig-activations", "steps": args.steps}}
    times, scores = measure(model, task, methods, args.repeats)
    text = table(name, len(scores["exact"]), task, times, scores, args.steps)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n## Circuit discovery (`python -m benchmarks.discovery`)\n\n" + text + "\n")
    return text


if __name__ == "__main__":
    main()
