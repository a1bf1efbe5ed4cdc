"""Attribution graphs, side by side in one run: `interp.attribute` on a 32-token prompt with the shipped
transcoders, beside a plain forward + backward of the same batch (the prompt repeated `batch_size`
times, no hooks), for gpt-4 and sprout-mini.

`attribute` keeps one forward of the batch and runs one backward per `batch_size` targets, so its floor is
about (its backward passes) x (one backward of the batch) plus one forward; the table gives both and
their ratio. Each side runs in a fresh process of its own (`in_fresh_process`), so neither inherits the
memory the other freed (glibc keeps it): its peak memory is the resident set of its first call above
what that process held before it (sampled every 5 ms); its times are medians of `--repeats` later calls,
wall and that process's CPU time; nothing is asserted.
circuit-tracer on the same export is `benchmarks/graphs_peer.py` (it needs the interop venv).

    python -m benchmarks.graphs [--models gpt-4 sprout-mini] [--tokens 32] [--batch 256] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

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


def in_fresh_process(module: str, args: Sequence[str]) -> dict:
    """What `python -m module *args --json FILE` writes to FILE, run in a fresh process from the repository
    root (so that its memory owes nothing to what this process allocated and freed before)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", module, *args, "--json", str(result)], check=True,
                       stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
        return json.loads(result.read_text())


def forward_backward(model, ids: torch.Tensor, batch: int) -> Callable[[], None]:
    def run():
        model.zero_grad(set_to_none=True)
        model(ids[None].expand(batch, -1)).float().logsumexp(-1).sum().backward()
    return run


def setup(name: str, tokens: int):
    """(model, prompt ids, transcoders): a shipped demo with its shipped transcoders (None), or "tiny"."""
    if name == "tiny":
        model, transcoders, ids = tiny_setup()
        return model, ids, transcoders
    model = load(name).eval()
    return model, prompt_ids(model, tokens), None


def side(name: str, which: str, tokens: int, batch: int, repeats: int) -> dict:
    """One side ("fb": forward + backward of `batch` copies; "attr": `attribute` with `batch_size=batch`):
    the peak memory of its first call above what the process held before it, then its median times."""
    model, ids, transcoders = setup(name, tokens)
    if which == "fb":
        fn = forward_backward(model, ids, batch)
    else:
        rm = interp.ReplacementModel(model, transcoders)
        fn = lambda: interp.attribute(rm, ids, batch_size=batch)  # noqa: E731
    mb = peak_mb(fn)
    wall, cpu = timed(fn, repeats)
    return {"mb": mb, "wall": wall, "cpu": cpu}


def measure(name: str, tokens: int, batch: int, repeats: int, threads: int) -> dict:
    """The graph's size here, then each side in a fresh process of its own (the forward + backward at the
    batch attribution used)."""
    model, ids, transcoders = setup(name, tokens)
    graph = interp.attribute(interp.ReplacementModel(model, transcoders), ids, batch_size=batch)
    b = graph.info["batch_size"]
    out = {"name": name, "tokens": len(ids), "features": graph.n_features, "logits": graph.n_logits,
           "passes": graph.info["backward_passes"], "batch": b, "nodes": graph.n_nodes}
    for which, size in (("fb", b), ("attr", batch)):
        got = in_fresh_process("benchmarks.graphs", ["--side", which, "--models", name, "--tokens", str(tokens),
                                                     "--batch", str(size), "--repeats", str(repeats),
                                                     "--threads", str(threads)])
        out[which], out[f"{which}_cpu"], out[f"{which}_mb"] = got["wall"], got["cpu"], got["mb"]
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


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt-4", "sprout-mini"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model with random transcoders, for a smoke run")
    ap.add_argument("--out", default=None, help="append the report to this Markdown file")
    ap.add_argument("--side", choices=["fb", "attr"], help=argparse.SUPPRESS)  # one side, in its own process
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["tiny"] if args.tiny else args.models
    if args.side:
        got = json.dumps(side(names[0], args.side, args.tokens, args.batch, args.repeats))
        Path(args.json).write_text(got)
        return got
    out = report([measure(name, args.tokens, args.batch, args.repeats, args.threads) for name in names])
    print(out)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n" + out + "\n")
    return out


if __name__ == "__main__":
    main()
