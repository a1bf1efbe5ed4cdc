"""Hooks cost nothing until used, and caching beats TransformerLens' TransformerBridge: the full table.

The table is measured twice, each time in a fresh process: with glibc's malloc as a plain `import sprout`
leaves it, and after the process-wide `sprout.keep_freed_memory()` that applications may opt in to
(`--allocator default|keep` measures one). Within a table every row runs in one process on the same
random weights of the Sprout preset, batch 4 x 256:
a plain hook-free reference (`benchmarks/plain_sprout.py`), Hugging Face's Qwen3ForCausalLM and
TransformerLens' TransformerBridge over the `sprout.files.hf.export` of those weights, and our hooked Sprout.
Within a group the calls are interleaved round-robin and each row's median is divided by its
reference's median from the same rounds, so load from other processes hits both sides alike. Each call
is timed on two clocks: wall (what a user waits) and this process's CPU time (the work done, which a
shared machine disturbs far less). No time is asserted anywhere; this is a benchmark, not a test.

    nice python -m benchmarks.run [--repeats 7] [--tiny] [--threads 2] [--allocator both] [--out benchmarks/RESULTS.md]

Cache memory is counted two ways: "tensor MB" adds up every cached tensor (what the issue's 910 MB for
the Bridge counts: its `hook_in`/`hook_out` aliases count again), "unique-storage MB" adds up the
distinct storages behind them (what the process really holds).

What profiling found and what was changed for it: docs/benchmark-notes.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import interp
import sprout
from benchmarks.plain_sprout import PlainSprout
from sprout import GPT, Sprout, SproutConfig
from sprout.files.hf import export
from sprout.names import act_name

TINY = SproutConfig(vocab_size=512, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128)


# --- the models -----------------------------------------------------------------------------------

def build(cfg: SproutConfig, folder: Path):
    """Our Sprout, the plain reference, HF's Qwen3 (sdpa attention) and the Bridge, all on one set of weights."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    ours = Sprout(cfg).eval()
    plain = PlainSprout(cfg).eval()
    plain.load_state_dict(ours.state_dict())
    export(ours, folder)

    def qwen3():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    # Two copies: the Bridge switches the model it wraps to eager attention (to expose the pattern).
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=qwen3(), device="cpu")
    return ours, plain, qwen3(), bridge


# --- measurements ---------------------------------------------------------------------------------

def interleaved(fns: dict, repeats: int) -> dict:
    """{name: (median wall seconds, median CPU seconds)} per call, the calls run round-robin.

    Wall time is what a user waits; CPU time (this process, all threads) is the work done, which
    other processes on a shared machine disturb much less.
    """
    wall, cpu = {name: [] for name in fns}, {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - w)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def cache_size(cache) -> tuple[int, float, float]:
    """(tensors, tensor MB, unique-storage MB) of a cache (dict or ActivationCache)."""
    tensors = list(cache.values())
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    mb = 2 ** 20
    return len(tensors), sum(t.numel() * t.element_size() for t in tensors) / mb, sum(storages.values()) / mb


def training_step(model, opt, tokens, targets):
    opt.zero_grad(set_to_none=True)
    _, loss = model(tokens, targets)
    loss.backward()
    opt.step()


def lens_floor(plain: PlainSprout, tokens: torch.Tensor, batch: int, k: int):
    """The least a logit lens can do: one forward, and the final norm, unembedding and top-k at every
    layer boundary (the embedding and after each block)."""
    T = tokens.shape[1]
    cos, sin = plain.cos[:T], plain.sin[:T]
    for ids in tokens.split(batch):
        x = plain.embed(ids)
        plain.head(plain.norm(x)).topk(k, dim=-1)
        for block in plain.blocks:
            x = block(x, cos, sin)
            plain.head(plain.norm(x)).topk(k, dim=-1)


def lens_by_hooks(model: Sprout, tokens: torch.Tensor, batch: int, k: int):
    """The floor's work done through our hooks: cache the streams, then norm, unembedding, top-k (the
    last block's stream is the output, whose logits the forward has already made)."""
    sites = [act_name("resid_pre", 0)] + [act_name("resid_post", l) for l in range(len(model.blocks) - 1)]
    for ids in tokens.split(batch):
        logits, cache = model.run_with_cache(ids, names_filter=sites)
        for name in sites:
            model.head(model.norm(cache[name])).topk(k, dim=-1)
        logits.topk(k, dim=-1)


def measure(cfg: SproutConfig, folder: Path, batch: int, pos: int, repeats: int, lens_tokens: int) -> tuple[list, dict]:
    """Time every row. Returns (rows, memory); a row is a dict with what / ms / cpu_ms / ratio / cpu_ratio /
    of (the row it is divided by, measured in the same rounds) / target."""
    ours, plain, hf, bridge = build(cfg, folder)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (batch, pos), generator=g)
    L = cfg.n_layer
    resid_post = [act_name("resid_post", l) for l in range(L)]
    probe_layer = min(2, L - 1)  # a block that exists, also in the 2-layer smoke run
    probe = act_name("resid_post", probe_layer - 1)  # what stop_at_layer=probe_layer returns (no blocks.{probe_layer}.* hook fires)
    buffers = {name: torch.empty(batch, pos, cfg.d_model) for name in resid_post}
    rows = []

    def add(times: dict, entries: list):
        names = {key: what for key, what, _, _ in entries}
        for key, what, ref, target in entries:
            (wall, cpu), (ref_wall, ref_cpu) = times[key], times[ref]
            rows.append(dict(what=what, ms=wall * 1e3, cpu_ms=cpu * 1e3, ratio=wall / ref_wall,
                             cpu_ratio=cpu / ref_cpu, of=names[ref] if ref != key else "reference", target=target))

    with torch.inference_mode():
        memory = dict(bridge=cache_size(bridge.run_with_cache(tokens)[1]), ours=cache_size(ours.run_with_cache(tokens)[1]))
        theirs, mine = bridge.run_with_cache(tokens)[1], ours.run_with_cache(tokens)[1]
        shared = [k for k in mine.keys() if k in theirs.keys()]
        memory["bridge_shared"] = cache_size({k: theirs[k] for k in shared})
        memory["ours_shared"] = cache_size({k: mine[k] for k in shared})
        # the Bridge also returns each name's aliases (blocks.0.hook_out), the same tensors
        cached = bridge.run_with_cache(tokens, names_filter=resid_post)[1].values()
        if len({t.untyped_storage().data_ptr() for t in cached}) != L:
            raise RuntimeError(f"the Bridge did not cache the {L} hook_resid_post activations asked for")
        del theirs, mine, cached

        inference = interleaved({
            "plain": lambda: plain(tokens),
            "hf": lambda: hf(tokens, use_cache=False),
            "bridge": lambda: bridge(tokens),
            "bridge_cache": lambda: bridge.run_with_cache(tokens),
            "bridge_resid": lambda: bridge.run_with_cache(tokens, names_filter=resid_post),
            "ours": lambda: ours(tokens),
            "ours_cache": lambda: ours.run_with_cache(tokens),
            "ours_resid": lambda: ours.run_with_cache(tokens, names_filter=resid_post),
            "into": lambda: ours.run_with_cache_into(tokens, buffers),
            "probe_full": lambda: ours.run_with_cache(tokens, names_filter=probe),
            "probe_stop": lambda: ours.run_with_cache(tokens, names_filter=probe, stop_at_layer=probe_layer),
        }, repeats)
    b, o = memory["bridge"], memory["ours"]
    add(inference, [
        ("plain", "plain hook-free model.py, forward", "plain", "reference"),
        ("hf", "Hugging Face Qwen3ForCausalLM, forward", "plain", "-"),
        ("bridge", "TransformerBridge, forward", "plain", "-"),
        ("bridge_cache", f"TransformerBridge `run_with_cache` (everything: {b[0]} tensors, {b[1]:.0f} MB)",
         "plain", "-"),
        ("bridge_resid", "TransformerBridge `run_with_cache` (`hook_resid_post` only)", "plain", "-"),
        ("ours", "our Sprout forward, no hooks", "plain", "<= 1.02x"),
        ("ours_cache", f"our `run_with_cache`, every hook ({o[0]} tensors, {o[1]:.0f} MB)", "plain", "<= 1.30x"),
        ("ours_resid", "our `run_with_cache`, `hook_resid_post` only", "plain", "<= 1.05x"),
        ("into", "our `run_with_cache_into` preallocated buffers, `hook_resid_post` only", "ours_resid", "-"),
        ("probe_full", f"our `run_with_cache`, `{probe}` only", "plain", "-"),
        ("probe_stop", f"the same probe with `stop_at_layer={probe_layer}`", "probe_full", "-"),
    ])

    ours.train()
    plain.train()
    targets = torch.randint(0, cfg.vocab_size, (batch, pos), generator=g)
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (plain, ours)}
    course = GPT.from_sprout(ours)  # the course's (logits, loss) on our weights, as plain's
    training = interleaved({
        "plain_step": lambda: training_step(plain, opts[plain], tokens, targets),
        "ours_step": lambda: training_step(course, opts[ours], tokens, targets),
    }, repeats)
    add(training, [
        ("plain_step", "plain training step (forward + backward + AdamW)", "plain_step", "reference"),
        ("ours_step", "our training step (forward + backward + AdamW)", "plain_step", "<= 1.03x"),
    ])
    ours.eval()
    plain.eval()

    seqs = max(1, lens_tokens // pos)
    n = seqs * pos
    lens_ids = torch.randint(0, cfg.vocab_size, (seqs, pos), generator=g)
    with torch.inference_mode():
        lens = interleaved({
            "floor": lambda: lens_floor(plain, lens_ids, batch, k=5),
            "hooks": lambda: lens_by_hooks(ours, lens_ids, batch, k=5),
            "lens": lambda: interp.logit_lens(ours, lens_ids, k=5, batch_size=batch),
            "lens_stats": lambda: interp.logit_lens(ours, lens_ids, k=5, batch_size=batch, stats=True),
        }, repeats)
    add(lens, [
        ("floor", f"logit lens floor, {n:,} tokens: plain forward + unembedding and top-5 per layer", "floor",
         "reference"),
        ("hooks", f"the floor's work through our `run_with_cache`, {n:,} tokens", "floor", "-"),
        ("lens", f"`interp.logit_lens`, {n:,} tokens, all layers, top-5 kept (and p of the next token)",
         "floor", "<= 1.2x"),
        ("lens_stats", "the same with `stats=True` (also rank of the next token, entropy and KL to the output, over the whole vocabulary)",
         "floor", "-"),
    ])
    return rows, memory


# --- the table ------------------------------------------------------------------------------------

def verdict(ratio: float, target: str) -> str:
    if not target.startswith("<="):
        return ""
    return "yes" if ratio <= float(target.split()[1].rstrip("x")) else "NO"


def table(rows: list, memory: dict) -> str:
    lines = ["| what | wall | ratio | CPU | CPU ratio | ratio of | target | met (wall / CPU) |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for r in rows:
        met = f"{verdict(r['ratio'], r['target'])} / {verdict(r['cpu_ratio'], r['target'])}" if r["target"].startswith("<=") else ""
        lines.append(f"| {r['what']} | {r['ms']:.0f} ms | {r['ratio']:.2f}x | {r['cpu_ms']:.0f} ms | {r['cpu_ratio']:.2f}x "
                     f"| {r['of']} | {r['target']} | {met} |")
    b, o = memory["bridge"], memory["ours"]
    bs, os_ = memory["bridge_shared"], memory["ours_shared"]
    lines += [
        "",
        "| cache memory | tensors | tensor MB | unique-storage MB |",
        "| --- | ---: | ---: | ---: |",
        f"| TransformerBridge, everything | {b[0]} | {b[1]:.0f} | {b[2]:.0f} |",
        f"| ours, every hook | {o[0]} | {o[1]:.0f} | {o[2]:.0f} |",
        f"| ours / Bridge (target <= 60%) | | {o[1] / b[1]:.0%} | {o[2] / b[2]:.0%} |",
        f"| TransformerBridge, the {bs[0]} hook names both have | {bs[0]} | {bs[1]:.0f} | {bs[2]:.0f} |",
        f"| ours, the same names | {os_[0]} | {os_[1]:.0f} | {os_[2]:.0f} |",
    ]
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"{datetime.datetime.now():%Y-%m-%d %H:%M}")


def lscpu(lines: int = 10) -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "(lscpu not available)"
    return "\n".join(out.splitlines()[:lines])


ALLOCATORS = {"default": "glibc's malloc as after a plain `import sprout` (the library's default path)",
              "keep": "after `sprout.keep_freed_memory()` (the process-wide opt-in of applications)"}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and few tokens, for a smoke run")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds per group")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--pos", type=int, default=256)
    ap.add_argument("--lens-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--allocator", choices=[*ALLOCATORS, "both"], default="both",
                    help="the C allocator's settings; 'both' runs the table once each way, each in a fresh process "
                         "(the opt-in cannot be undone within one)")
    ap.add_argument("--rows-json", help=argparse.SUPPRESS)  # where a child process of --allocator both puts its rows
    ap.add_argument("--out", help="also write the table, with the machine's `lscpu`, to this markdown file")
    return ap.parse_args(argv)


def one_way(args: argparse.Namespace) -> tuple[list, str]:
    """The whole table under one allocator setting, in this process: (rows, report)."""
    if args.allocator == "keep":
        sprout.keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TINY if args.tiny else SproutConfig.preset("sprout")
    pos = min(args.pos, cfg.context)
    lens_tokens = min(args.lens_tokens, 4 * pos) if args.tiny else args.lens_tokens
    with tempfile.TemporaryDirectory() as tmp:
        rows, memory = measure(cfg, Path(tmp) / "qwen3", args.batch, pos, args.repeats, lens_tokens)
    stop = next(r for r in rows if "stop_at_layer" in r["what"])
    into = next(r for r in rows if "run_with_cache_into" in r["what"])
    n_params = sum(p.numel() for p in PlainSprout(cfg).parameters())
    report = "\n".join([
        f"### Allocator: {ALLOCATORS[args.allocator]}",
        "",
        f"{'tiny config' if args.tiny else 'Sprout preset'} ({n_params / 1e6:.2f}M parameters, random weights), "
        f"batch {args.batch} x {pos} tokens, medians of {args.repeats} interleaved rounds; {machine()}",
        "",
        table(rows, memory),
        "",
        f"stop_at_layer probe: {1 / stop['ratio']:.1f}x faster than the full run (CPU {1 / stop['cpu_ratio']:.1f}x); "
        f"run_with_cache_into: {into['ratio']:.2f}x the time of run_with_cache (CPU {into['cpu_ratio']:.2f}x)",
    ])
    return rows, report


def both_ways(argv: list) -> tuple[list, str]:
    """The table once per allocator setting, each in a fresh process: (all rows, the reports)."""
    rows, reports = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for way in ALLOCATORS:
            out = Path(tmp) / f"{way}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.run", *argv, "--allocator", way, "--rows-json", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            got = json.loads(out.read_text())
            rows += [{**r, "allocator": way} for r in got["rows"]]
            reports.append(got["report"])
    return rows, "\n\n".join(reports)


def main(argv=None) -> list:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.allocator == "both":
        rows, report = both_ways(_without(argv, "--out", "--allocator"))
    else:
        rows, report = one_way(args)
    if args.rows_json:
        Path(args.rows_json).write_text(json.dumps({"rows": rows, "report": report}))
        return rows
    print(report)
    if args.out:
        command = " ".join(["python -m benchmarks.run", *argv])
        Path(args.out).write_text(f"# Benchmarks\n\n`{command}`\n\n{report}\n\n`lscpu | head`:\n\n```\n{lscpu()}\n```\n")
    return rows


def _without(argv: list, *flags: str) -> list:
    """argv less each of `flags` and its value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


if __name__ == "__main__":
    main()
