"""Attribution graphs, side by side in one run: `interp.attribute` on a 32-token prompt with the shipped
transcoders, beside a plain forward + backward of the same batch (the prompt repeated `batch_size`
times, no hooks), for gpt-4 and sprout-mini.

`attribute` keeps one forward of the batch and runs one backward per `batch_size` targets, so its floor is
about (its backward passes) x (one backward of the batch) plus one forward; the table gives both and
their ratio. Peak memory is the process's resident set above what it held before the call (sampled
every 5 ms). Times are medians of `--repeats` runs, wall and this process's CPU time; nothing is asserted.
circuit-tracer on the same export is `benchmarks/graphs_peer.py` (it needs the interop venv).

    python -m benchmarks.graphs [--models gpt-4 sprout-mini] [--tokens 32] [--batch 256] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
from interp import held_out_stories  # noqa: E402
from sprout import Sprout, SproutConfig  # noqa: E402
from sprout.files import load  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


def peak_mb(fn: Callable[[], object]) -> float:
    """The peak resident memory above the start while fn runs, in MB (0 where /proc is missing)."""
    try:
        start = _rss_mb()
    except OSError:
        fn()
        return 0.0
    peak, done = [start], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return max(peak[0], _rss_mb()) - start


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of fn after one warm-up call."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return statistics.median(wall), statistics.median(cpu)


def forward_backward(model, ids: torch.Tensor, batch: int) -> Callable[[], None]:
    def run():
        model.zero_grad(set_to_none=True)
        model(ids[None].expand(batch, -1)).float().logsumexp(-1).sum().backward()
    return run


def measure(name: str, model, ids: torch.Tensor, transcoders, batch: int, repeats: int) -> dict:
    rm = interp.ReplacementModel(model, transcoders)
    graph = interp.attribute(rm, ids, batch_size=batch)
    b = graph.info["batch_size"]
    fb = forward_backward(model, ids, b)
    attr = lambda: interp.attribute(rm, ids, batch_size=batch)  # noqa: E731
    out = {"name": name, "tokens": len(ids), "features": graph.n_features, "logits": graph.n_logits,
           "passes": graph.info["backward_passes"], "batch": b, "nodes": graph.n_nodes}
    out["fb"], out["fb_cpu"] = timed(fb, repeats)
    out["attr"], out["attr_cpu"] = timed(attr, repeats)
    out["fb_mb"], out["attr_mb"] = peak_mb(fb), peak_mb(attr)
    model.zero_grad(set_to_none=True)
    return out


def report(rows: list[dict]) -> str:
    lines = [f"Attribution graphs ({torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d %H:%M')}): "
             "`interp.attribute` beside one forward + backward of the same batch", "",
             "| model | tokens | feature rows | logits | batch | backward passes | forward+backward s (CPU s) | "
             "attribute s (CPU s) | attribute / fwd+bwd | attribute / (passes x fwd+bwd) | peak MB fwd+bwd | "
             "peak MB attribute |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        floor = r["passes"] * r["fb"]
        lines.append(f"| {r['name']} | {r['tokens']} | {r['features']:,} | {r['logits']} | {r['batch']} | {r['passes']} | "
                     f"{r['fb']:.3f} ({r['fb_cpu']:.3f}) | {r['attr']:.2f} ({r['attr_cpu']:.2f}) | {r['attr'] / r['fb']:.2f}x | "
                     f"{r['attr'] / floor:.2f}x | "
                     f"{r['fb_mb']:.0f} | {r['attr_mb']:.0f} |")
    return "\n".join(lines)


def prompt_ids(model, tokens: int) -> torch.Tensor:
    text = held_out_stories(4000)
    ids = model.to_tokens(text, prepend_bos=False)[0]
    if len(ids) < tokens:
        raise ValueError(f"the held-out text has only {len(ids)} tokens, fewer than --tokens {tokens}")
    return ids[:tokens]


def tiny_setup():
    """A tiny random model and random TopK skip transcoders (a smoke run)."""
    torch.manual_seed(0)
    model = Sprout(SproutConfig(vocab_size=256, context=64, n_layer=2, n_head=2, d_model=32, d_ff=64)).eval()
    tcs = [interp.Transcoder(32, 64, kind="topk", k=4, skip=True, layer=l, seed=l) for l in range(2)]
    return model, tcs, torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(0))


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt-4", "sprout-mini"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model with random transcoders, for a smoke run")
    ap.add_argument("--out", default=None, help="append the report to this Markdown file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    if args.tiny:
        model, tcs, ids = tiny_setup()
        rows.append(measure("tiny", model, ids, tcs, args.batch, args.repeats))
    for name in [] if args.tiny else args.models:
        model = load(name).eval()
        rows.append(measure(name, model, prompt_ids(model, args.tokens), None, args.batch, args.repeats))
    out = report(rows)
    print(out)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + out + "\n")
    return out


if __name__ == "__main__":
    main()
