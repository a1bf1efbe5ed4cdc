"""Tuned-lens training throughput beside its floor, measured side by side in one process.

The floor is the work a lens step cannot avoid: one forward of the model with the streams cached, plus,
per translator, one [tokens, d_model] x [d_model, d_model] and one [tokens, d_model] x [d_model, vocab]
matmul forward and their backward (the translator's weight gradient, the gradient into the stream).
Ours is a whole `train_tuned_lens` step: that plus the norms, softmaxes, the KL, clipping and SGD.

    python -m benchmarks.tuned_lens [--model gpt-4] [--batch 8] [--repeats 5] [--tiny]
"""
import argparse
import sys
from pathlib import Path

import torch

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
from benchmarks.run import interleaved  # noqa: E402
from interp.lens._loss import Scratch as _Scratch  # noqa: E402
from interp.lens.train import _frozen, lens_step  # noqa: E402
from sprout import Sprout, SproutConfig  # noqa: E402
from sprout.files import load  # noqa: E402

TARGET = 0.70  # ours at least 70% of the floor's tokens/s


def floor_fn(model, lens, ids):
    names = lens.sites[:-1]
    d, V = int(model.cfg.d_model), int(model.cfg.d_vocab)
    n = ids.numel()
    g = torch.Generator().manual_seed(0)
    A, W_U = torch.randn(d, d, generator=g) / d**0.5, torch.randn(V, d, generator=g) / d**0.5
    grad_logits = torch.randn(n, V, generator=g)

    def run():
        with torch.no_grad():
            _, cache = model.run_with_cache(ids, names_filter=names)
            for name in names:
                x = cache[name].reshape(n, d)
                y = x @ A  # translator, forward
                y @ W_U.T  # unembedding, forward
                grad_x = grad_logits @ W_U  # backward into the stream
                x.T @ grad_x  # translator's weight gradient
    return run


def ours_fn(model, lens, ids):
    opt = torch.optim.SGD(lens.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    scratch = _Scratch()  # as train_tuned_lens keeps one for all its steps

    def run():
        with _frozen(model):
            lens_step(model, lens, ids, scratch=scratch)
            torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


def measure(model, batch: int, repeats: int) -> dict:
    lens = interp.TunedLens(model)
    ids = torch.randint(0, int(model.cfg.d_vocab), (batch, int(model.cfg.n_ctx)), generator=torch.Generator().manual_seed(1))
    t = interleaved({"floor": floor_fn(model, lens, ids), "ours": ours_fn(model, lens, ids)}, repeats)
    n = ids.numel()
    return dict(tokens=n, floor=n / t["floor"][0], ours=n / t["ours"][0], floor_cpu=n / t["floor"][1], ours_cpu=n / t["ours"][1])


def table(results: dict) -> str:
    lines = ["| model | tokens per step | floor tokens/s | ours tokens/s | ours / floor (wall) | (CPU) | target | met |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, r in results.items():
        ratio, cpu = r["ours"] / r["floor"], r["ours_cpu"] / r["floor_cpu"]
        lines.append(f"| {name} | {r['tokens']:,} | {r['floor']:,.0f} | {r['ours']:,.0f} | {ratio:.0%} | {cpu:.0%} | "
                     f">= {TARGET:.0%} | {'yes' if min(ratio, cpu) >= TARGET else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt-1", "gpt-4", "sprout-mini"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model, for a smoke run")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        torch.manual_seed(0)
        models = {"tiny": Sprout(SproutConfig(vocab_size=256, context=32, n_layer=2, n_head=2, d_model=32, d_ff=64)).eval()}
        args.repeats = 1
    else:
        models = {name: load(name) for name in args.models}
    results = {name: measure(m, args.batch, args.repeats) for name, m in models.items()}
    print(f"tuned-lens training step, batch {args.batch} x context, medians of {args.repeats} interleaved rounds, "
          f"{torch.get_num_threads()} threads\n")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
