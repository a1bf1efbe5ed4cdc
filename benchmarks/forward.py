"""Hooks cost nothing until used: the hooked Sprout's forward against a plain one, same weights.

Prints the ratio of the medians of interleaved timings (hooked / plain), so machine noise hits both
sides alike. Target: <= 1.03 with no hooks attached.

    python -m benchmarks.forward [--tiny] [--repeats 15]
"""
import argparse
import statistics
import time

import torch

import sprout
from benchmarks.plain_sprout import PlainSprout
from sprout import Sprout, SproutConfig


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median seconds per call of each function, run round-robin so drift affects all equally."""
    times = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model, for a smoke run")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--pos", type=int, default=256)
    args = ap.parse_args(argv)
    sprout.keep_freed_memory()  # caches reuse freed memory instead of page-faulting it in (README: Benchmarks)
    cfg = (SproutConfig(vocab_size=512, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128) if args.tiny
           else SproutConfig.preset("sprout"))
    pos = min(args.pos, cfg.context)
    hooked = Sprout(cfg).eval()
    plain = PlainSprout(cfg).eval()
    plain.load_state_dict(hooked.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, pos))
    with torch.inference_mode():
        med = interleaved_medians({"plain": lambda: plain(tokens), "hooked": lambda: hooked(tokens)}, args.repeats)
    print(f"forward, batch {args.batch} x {pos} tokens, {sum(p.numel() for p in plain.parameters()):,} parameters")
    print(f"  plain model.py-style : {med['plain'] * 1e3:8.1f} ms   1.00x")
    print(f"  hooked, no hooks     : {med['hooked'] * 1e3:8.1f} ms   {med['hooked'] / med['plain']:.3f}x (target <= 1.03)")
    return med


if __name__ == "__main__":
    main()
