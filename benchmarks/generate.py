"""Generation with and without the key-value cache, ours beside TransformerLens' on the same weights.

Greedy generation of `--new` tokens after a random prompt, on random weights of a course preset
(default gpt-4): our `generate(use_past_kv_cache=False)` (the reference, 1.00x) and `=True`, and
TransformerLens 4.3's `TransformerBridge.generate` (TL 4 has no HookedTransformer; the Bridge over the
`sprout.files.hf.export` of the same weights is its equivalent model) both ways. Calls are interleaved
round-robin and each row is its median over the rounds divided by the reference's, on wall and CPU
time. Every row must draw the same tokens; the last line says whether they did. No time is asserted.

    nice python -m benchmarks.generate [--preset gpt-4] [--new 200] [--repeats 3] [--tiny] [--no-bridge]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.run import TINY, interleaved
from sprout import Sprout, SproutConfig
from sprout.files.hf import export


def bridge_of(model: Sprout, folder: Path):
    """TransformerLens' TransformerBridge over HF's Qwen3 loaded from the export of `model`'s weights."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    export(model, folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return TransformerBridge.boot_transformers(str(folder), hf_model=hf, device="cpu")


def calls(model: Sprout, bridge, prompt: torch.Tensor, new: int) -> dict:
    """{row name: a function returning the generated ids [batch, prompt + new]}."""
    greedy = dict(max_new_tokens=new, do_sample=False, stop_at_eos=False, verbose=False)
    fns = {"our generate, no KV cache": lambda: model.generate(prompt, use_past_kv_cache=False, **greedy),
           "our generate, KV cache": lambda: model.generate(prompt, use_past_kv_cache=True, **greedy)}
    if bridge is not None:
        fns["TransformerBridge generate, no KV cache"] = lambda: bridge.generate(prompt, use_past_kv_cache=False, **greedy)
        fns["TransformerBridge generate, KV cache"] = lambda: bridge.generate(prompt, use_past_kv_cache=True, **greedy)
    return fns


def table(times: dict, header: str, same: bool) -> str:
    ref_wall, ref_cpu = times["our generate, no KV cache"]
    lines = [header, "", "| what | wall | ratio | CPU | ratio |", "|---|---|---|---|---|"]
    for name, (wall, cpu) in times.items():
        lines.append(f"| {name} | {wall * 1e3:.0f} ms | {wall / ref_wall:.2f}x | {cpu * 1e3:.0f} ms | {cpu / ref_cpu:.2f}x |")
    lines += ["", f"same tokens in every row: {'yes' if same else 'NO'}"]
    return "\n".join(lines)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.generate", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-4", help="a course preset: gpt-1, gpt-4, sprout")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and a few tokens, for a smoke run")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    ap.add_argument("--new", type=int, default=200, help="tokens to generate")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-bridge", action="store_true", help="leave out TransformerLens' rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    cfg = TINY if args.tiny else SproutConfig.preset(args.preset)
    new = min(args.new, cfg.context - args.prompt)
    torch.manual_seed(0)
    model = Sprout(cfg).eval()
    prompt = torch.randint(1, cfg.vocab_size, (args.batch, args.prompt))
    with tempfile.TemporaryDirectory() as tmp:
        bridge = None if args.no_bridge else bridge_of(model, Path(tmp) / "hf")
        fns = calls(model, bridge, prompt, new)
        outs = {name: fn() for name, fn in fns.items()}
        with torch.inference_mode():
            times = interleaved(fns, args.repeats)
    first = next(iter(outs.values()))
    same = all(torch.equal(o.cpu(), first.cpu()) for o in outs.values())
    header = (f"generate, greedy, batch {args.batch}: a {args.prompt}-token prompt + {new} new tokens, "
              f"{sum(p.numel() for p in model.parameters()):,} parameters, {args.threads} threads, "
              f"median of {args.repeats} interleaved rounds")
    text = table(times, header, same)
    print(text)
    return text


if __name__ == "__main__":
    main()
