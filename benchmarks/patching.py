"""A full head x position activation-patching sweep: ours against TransformerLens', on the same weights.

Every row runs in this one process on the same random weights of the Sprout preset: TransformerLens'
`patching.get_act_patch_attn_head_out_by_pos` on our Sprout and on the TransformerBridge over the
`sprout.files.hf.export` of those weights (built offline as in `benchmarks/run.py`), `interp.patch(site="z",
by="head_position")`, and `interp.attribution_patch` on the same sweep. The calls are interleaved
round-robin and the medians compared; the sweeps must agree (within 1e-4) or the table is refused.
nnsight is not a project dependency: where it is installed (`pip install nnsight` in a venv made with
`--system-site-packages`), a row runs the same sweep through it, one trace per patch as its patching
tutorial does.

    nice python -m benchmarks.patching [--pos 24] [--repeats 3] [--out benchmarks/RESULTS.md]

Why ours is faster: TransformerLens runs one forward of the whole corrupted batch per patch (here
n_layers x n_heads x pos forwards, each with its pandas row, hook registration and tqdm step);
`interp.patch` stacks as many patches as fit 256 MB of logits into one forward (one hook call per
layer patches every copy), each layer's forwards start at that layer from the corrupted stream, and with
`logit_positions` only the positions the metric reads are unembedded.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformer_lens import patching

import interp
from benchmarks.run import build
from interp.patching.activation import patch_tensor
from sprout import SproutConfig
from sprout.names import act_name

try:  # optional peer, not a project dependency
    from nnsight import NNsight
except ImportError:
    NNsight = None


def pair(vocab: int, pos: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, vocab, (1, pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, pos // 3] = torch.randint(1, vocab, (1,), generator=g)
    return clean, corrupted


def make_metric(a: int, b: int):
    def metric(logits):
        return (logits[:, -1, a] - logits[:, -1, b]).mean()
    return metric


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def calls(ours, bridge, clean, corrupted, metric) -> dict:
    def tl(model):
        _, cache = model.run_with_cache(clean)
        return patching.get_act_patch_attn_head_out_by_pos(model, corrupted, cache, metric)
    return {
        "tl_ours": lambda: tl(ours),
        "tl_bridge": lambda: tl(bridge),
        "ours": lambda: patch_tensor(interp.patch(ours, clean, corrupted, metric, site="z", by="head_position")),
        "ours_last": lambda: patch_tensor(interp.patch(ours, clean, corrupted, metric, site="z", by="head_position",
                                                       logit_positions=-1)),
        "attribution": lambda: interp.attribution_patch(ours, clean, corrupted, metric, site="z", by="head_position"),
        **({"nnsight": lambda: nnsight_sweep(ours, clean, corrupted, metric)} if NNsight is not None else {}),
    }


def nnsight_sweep(model, clean, corrupted, metric) -> torch.Tensor:
    """[n_layers, pos, n_heads]: the metric with one head's z at one position patched from the clean run,
    one nnsight trace per patch."""
    _, cache = model.run_with_cache(clean, names_filter=lambda name: name.endswith("attn.hook_z"))
    traced = NNsight(model)
    L, P, H = len(model.blocks), clean.shape[1], int(model.cfg.n_heads)
    out = torch.zeros(L, P, H)
    with torch.no_grad():
        for l in range(L):
            source = cache[act_name("z", l)]
            for p in range(P):
                for h in range(H):
                    with traced.trace(corrupted):
                        traced.blocks[l].attn.hook_z.output[:, p, h] = source[:, p, h]
                        value = metric(traced.output).save()
                    out[l, p, h] = float(getattr(value, "value", value))
    return out


def measure(fns: dict, repeats: int) -> tuple[dict, dict]:
    times, outs = {k: [] for k in fns}, {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t, outs[name] = timed(fn)
            times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items()}, outs


def table(cfg, pos: int, times: dict, outs: dict, name: str = "Sprout preset") -> str:
    exact = outs["ours"]
    peers = [k for k in ("tl_ours", "tl_bridge", "nnsight", "ours_last") if k in outs]
    diff = float(max((exact - outs[k].float()).abs().max() for k in peers))
    if diff > 1e-4:
        raise RuntimeError(f"our sweep differs from TransformerLens' by {diff:.2e}: the timings would compare different work")
    est = torch.tensor(outs["attribution"]["estimate"].to_numpy())
    r = float(torch.corrcoef(torch.stack([est, exact.flatten()]))[0, 1])
    n = cfg.n_layer * cfg.n_head * pos
    rows = [
        ("TransformerLens `get_act_patch_attn_head_out_by_pos`, our Sprout", "tl_ours", "reference", "-"),
        ("TransformerLens `get_act_patch_attn_head_out_by_pos`, TransformerBridge", "tl_bridge", "tl_ours", "-"),
        ("`interp.patch(site='z', by='head_position')`", "ours", "tl_ours", "<= 0.2x"),
        ("the same with `logit_positions=-1` (the metric reads the last position: only it is unembedded)", "ours_last",
         "tl_ours", "<= 0.2x"),
        ("`interp.attribution_patch` (same sweep, 2 forwards + 1 backward)", "attribution", "ours", "-"),
    ]
    if "nnsight" in times:
        rows.insert(2, ("nnsight, one trace per patch, our Sprout", "nnsight", "tl_ours", "-"))
        rows.append(("`interp.patch(site='z', by='head_position')` against nnsight", "ours", "nnsight", "<= 0.2x"))
        rows.append(("the same with `logit_positions=-1` against nnsight", "ours_last", "nnsight", "<= 0.2x"))
    peer_names = "TransformerLens'" + (" and nnsight" if "nnsight" in outs else "")
    lines = [f"Full head x position sweep: {cfg.n_layer} layers x {cfg.n_head} heads x {pos} positions = {n} patches, "
             f"batch 1, {name} (random weights); our sweep equals {peer_names} within {diff:.1e}; "
             f"attribution estimate vs exact: Pearson r = {r:.3f}.", "",
             "| what | wall | ratio | ratio of | target | met |", "| --- | ---: | ---: | --- | --- | --- |"]
    for label, key, ref, target in rows:
        ratio = times[key] / times[ref] if ref != "reference" else 1.0
        met = "" if target == "-" else ("yes" if ratio <= 0.2 else "no")
        ref_label = "reference" if ref == "reference" else next(r[0] for r in rows if r[1] == ref)
        lines.append(f"| {label} | {times[key]:.2f} s | {ratio:.3f}x | {ref_label} | {target} | {met} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.patching", description=__doc__.splitlines()[0])
    p.add_argument("--pos", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    p.add_argument("--out", default=None, help="append the table to this markdown file")
    args = p.parse_args(argv)
    cfg = (SproutConfig(vocab_size=512, context=64, n_layer=2, n_head=4, d_model=64, d_ff=128) if args.tiny
           else SproutConfig.preset("sprout"))
    with tempfile.TemporaryDirectory() as folder:
        ours, _, _, bridge = build(cfg, Path(folder))
        clean, corrupted = pair(cfg.vocab_size, args.pos)
        times, outs = measure(calls(ours, bridge, clean, corrupted, make_metric(5, 9)), args.repeats)
    text = table(cfg, args.pos, times, outs, "tiny model" if args.tiny else "Sprout preset")
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write("\n## Activation patching (`python -m benchmarks.patching`)\n\n" + text + "\n")
    return text


if __name__ == "__main__":
    main()
