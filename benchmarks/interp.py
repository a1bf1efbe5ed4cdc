"""Throughput of interp's streaming analyses beside a plain forward on the same tokens.

Prints tokens/s for: the forward alone, the logit lens as streamed per-layer statistics
(`lens_dataset_summary`), the logit lens as the full per-position table (`logit_lens`, top-5), and the
residual RMS (`residual_rms`, stream and writes). The Sprout preset with random weights by default.

    python -m benchmarks.interp [--tiny] [--seqs 16] [--pos 256] [--batch 8] [--repeats 3]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as a file, this folder comes first on sys.path and `import interp` finds this file
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
import sprout  # noqa: E402
from sprout import Sprout, SproutConfig  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and few tokens, for a smoke run")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--pos", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args(argv)
    sprout.keep_freed_memory()  # caches reuse freed memory instead of page-faulting it in (README: Benchmarks)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        cfg = SproutConfig(vocab_size=512, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)
        args.seqs, args.pos, args.repeats = min(args.seqs, 4), min(args.pos, 64), 1
    else:
        cfg = SproutConfig.preset("sprout")
    torch.manual_seed(0)
    model = Sprout(cfg).eval()
    tokens = torch.randint(0, cfg.vocab_size, (args.seqs, min(args.pos, cfg.context)))
    n = tokens.numel()

    def forward():
        with torch.inference_mode():
            for batch in tokens.split(args.batch):
                model(batch)

    runs = {
        "plain forward": forward,
        "logit lens, streamed stats": lambda: interp.lens_dataset_summary(model, tokens, batch_size=args.batch),
        "logit lens, full table (k=5)": lambda: interp.logit_lens(model, tokens, k=5, batch_size=args.batch),
        "residual RMS (+ writes)": lambda: interp.residual_rms(model, tokens, batch_size=args.batch),
    }
    print(f"{n:,} tokens ({args.seqs} x {tokens.shape[1]}), batch {args.batch}, {model.num_params():,} parameters, "
          f"{torch.get_num_threads()} threads")
    base = None
    results = {}
    for name, fn in runs.items():
        s = median_seconds(fn, args.repeats)
        base = base or s
        results[name] = n / s
        print(f"  {name:30s} {n / s:12,.0f} tokens/s   {s / base:6.2f}x the forward's time")
    return results


if __name__ == "__main__":
    main()
