"""Peer run: our `interp.attribute` beside circuit-tracer's `attribute` on the same exported model,
transcoders and prompt: the adjacency both give, and the time and peak memory each takes.

What circuit-tracer runs on is what a user would hand it from our files alone:
- the model: `sprout.files.hf.export` (a Qwen3ForCausalLM folder), read by TransformerLens' own Qwen3
  config and weight conversion (`loading_from_pretrained`), into circuit-tracer's
  `TransformerLensReplacementModel` (a HookedTransformer subclass), then configured with the transcoders
  exactly as its `from_pretrained_and_transcoders` does (TransformerLens 3.9 accepts only its list of hub
  names in `from_pretrained`, so that one step is done by hand);
- the transcoders: `interp.saes.save_circuit_tracer`'s folder, read by its own `load_transcoder_set` (a
  cross-layer transcoder's by its `load_clt`: `their_transcoders`);
- the prompt: token ids starting with `<|endoftext|>` (id 0). circuit-tracer prepends a special token to
  a prompt that does not start with one, and picks it with `filter(None, ...)`, which skips id 0; a
  prompt that already starts with a special token is kept as it is, so both sides see the same ids and
  both hold position 0 constant (its features and errors are no nodes).

Both graphs are put in one node order before they are compared (`aligned`): circuit-tracer sorts its
selected features by their index in active_features, ours lists them in the order attribution visited
them; errors (layer-major), tokens and logits are in the same order in both formats.

circuit-tracer 0.5.0 imports `HF_HUB_ENABLE_HF_TRANSFER` from huggingface_hub, which huggingface_hub 1.x
removed; it only chooses a download backend for hub transcoders, so the constant is set to False if it
is missing (`import_circuit_tracer`). Needs the interop venv of `.ci/run` (docs/compatibility.md):

    HF_HUB_OFFLINE=1 /tmp/interop-venv/bin/python -m benchmarks.graphs_peer [--models gpt-4 sprout-mini] [--tokens 32]

Without circuit-tracer it prints why and measures nothing. No time is asserted anywhere.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import yaml

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
import interp  # noqa: E402
from benchmarks.graphs import in_fresh_process, peak_mb, timed  # noqa: E402
from interp.saes import save_circuit_tracer  # noqa: E402
from sprout.files import load  # noqa: E402
from sprout.files.hf import export  # noqa: E402


def import_circuit_tracer():
    """circuit-tracer's `attribute`, `load_transcoder_set` and `TransformerLensReplacementModel`, or
    ImportError saying why (not installed, or TransformerLens / transformers missing)."""
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError as e:
        raise ImportError(f"circuit-tracer needs huggingface_hub: {e}") from e
    if not hasattr(hub_constants, "HF_HUB_ENABLE_HF_TRANSFER"):
        hub_constants.HF_HUB_ENABLE_HF_TRANSFER = False  # type: ignore[attr-defined]  # see the module docstring
    try:
        from circuit_tracer import attribute
        from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
        from circuit_tracer.transcoder import load_transcoder_set
    except ImportError as e:
        raise ImportError(f"circuit-tracer is not importable here ({e}); it runs in the interop venv that "
                          ".ci/run builds (docs/compatibility.md)") from e
    return attribute, load_transcoder_set, TransformerLensReplacementModel


def their_transcoders(transcoders: Union[Sequence[interp.Transcoder], interp.CrossLayerTranscoder], folder: Path,
                      model, dtype: torch.dtype = torch.float32):
    """`transcoders` as `save_circuit_tracer` writes them to `folder`, read back by circuit-tracer's own loader
    for the folder's `model_kind`: `load_transcoder_set` (per-layer) or `load_clt` (cross-layer), on the CPU."""
    _, load_transcoder_set, _ = import_circuit_tracer()
    ct = save_circuit_tracer(transcoders, folder, model)
    config = yaml.safe_load((ct / "config.yaml").read_text())
    common = {"scan": config["scan"], "feature_input_hook": config["feature_input_hook"],
              "feature_output_hook": config["feature_output_hook"], "device": torch.device("cpu"), "dtype": dtype}
    if config["model_kind"] == "cross_layer_transcoder":
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        return load_clt(str(ct), **common)  # its default: decoder rows read from the files when needed
    paths = {l: str(ct / f"layer_{l}.safetensors") for l in range(model.cfg.n_layers)}
    return load_transcoder_set(paths, lazy_encoder=False, lazy_decoder=False, **common)


def their_model(model, transcoders: Union[Sequence[interp.Transcoder], interp.CrossLayerTranscoder], folder: Path,
                dtype: torch.dtype = torch.float32):
    """circuit-tracer's replacement model of `model` with `transcoders` (per-layer or one cross-layer), built
    from our exports in `folder` (the Hugging Face export and the transcoder folder; see the module docstring)."""
    from transformer_lens import loading_from_pretrained as loading
    from transformers import AutoTokenizer

    ReplacementModel = import_circuit_tracer()[2]
    folder = Path(folder)
    hf = export(model, folder / "hf", overwrite=True)
    loaded = their_transcoders(transcoders, folder / "transcoders", model, dtype)
    cfg = loading.get_pretrained_model_config(str(hf), dtype=dtype, device="cpu")
    state = loading.get_pretrained_state_dict(str(hf), cfg, dtype=dtype)
    theirs = ReplacementModel(cfg, AutoTokenizer.from_pretrained(str(hf)), move_to_device=False)
    theirs.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False)
    theirs._configure_replacement_model(loaded)  # what from_pretrained_and_transcoders does after loading
    return theirs


def node_keys(graph) -> list[tuple]:
    """Each node of a graph (ours or circuit-tracer's) in its own order: ("feature", layer, pos, id),
    ("error", layer, pos), ("token", pos), ("logit", vocab index)."""
    feats = graph.active_features[graph.selected_features].tolist()
    n_pos = int(graph.input_tokens.numel())
    n_layers = (graph.adjacency_matrix.shape[0] - len(feats) - n_pos - len(graph.logit_targets)) // n_pos
    return ([("feature", *f) for f in feats] + [("error", l, p) for l in range(n_layers) for p in range(n_pos)]
            + [("token", p) for p in range(n_pos)] + [("logit", int(t[1])) for t in graph.logit_targets])


def aligned(graph) -> tuple[list[tuple], torch.Tensor]:
    """(sorted node keys, the adjacency [targets, sources] in that order, float64)."""
    keys = node_keys(graph)
    order = sorted(range(len(keys)), key=lambda i: (("feature", "error", "token", "logit").index(keys[i][0]), keys[i][1:]))
    idx = torch.tensor(order, dtype=torch.long)
    return [keys[i] for i in order], graph.adjacency_matrix.double()[idx][:, idx]


def agreement(ours, theirs) -> dict:
    """How far apart two graphs of one prompt are, node by node (ValueError if their nodes differ).

    Returns:
        {"nodes", "features", "max_abs": max |A_ours - A_theirs|, "max_row_rel": the largest over target rows
        of max |difference| / max |entry| of our row, "same_support": whether the same entries are zero}.
    """
    k1, a1 = aligned(ours)
    k2, a2 = aligned(theirs)
    if k1 != k2:
        only = sorted(set(k1) ^ set(k2))[:5]
        raise ValueError(f"the graphs have different nodes ({len(k1)} and {len(k2)}; e.g. {only})")
    diff = (a1 - a2).abs()
    rows = a1.abs().amax(1) > 0
    rel = diff[rows].amax(1) / a1[rows].abs().amax(1)
    return {"nodes": len(k1), "features": sum(k[0] == "feature" for k in k1), "max_abs": float(diff.max()),
            "max_row_rel": float(rel.max()), "same_support": bool(torch.equal(a1 != 0, a2 != 0))}


def prompt_ids(model, tokens: int) -> torch.Tensor:
    """`<|endoftext|>` then the first tokens of the held-out stories: `tokens` ids in all."""
    eot = model.tokenizer.token_to_id("<|endoftext|>")
    text_ids = model.to_tokens(interp.held_out_stories(4000), prepend_bos=False)[0][:tokens - 1]
    return torch.cat([torch.tensor([eot]), text_ids])


def side(name: str, which: str, tokens: int, batch: int, repeats: int, folder: Path) -> dict:
    """One side ("ours" or "theirs") on `name`'s shipped transcoders, float32, no feature cap: the peak
    resident memory of its first call above what the process held before it, then its median times."""
    model = load(name).eval()
    ids = prompt_ids(model, tokens)
    transcoders = [interp.load_transcoder(model, layer) for layer in range(model.cfg.n_layers)]
    if which == "ours":
        rm = interp.ReplacementModel(model, transcoders)
        fn = lambda: interp.attribute(rm, ids, batch_size=batch)  # noqa: E731
    else:
        attribute_theirs, theirs_model = import_circuit_tracer()[0], their_model(model, transcoders, folder)
        fn = lambda: attribute_theirs(ids, theirs_model, batch_size=batch)  # noqa: E731
    mb = peak_mb(fn)
    wall, cpu = timed(fn, repeats)
    return {"mb": mb, "wall": wall, "cpu": cpu}


def measure(name: str, tokens: int, batch: int, repeats: int, folder: Path, threads: int) -> dict:
    """Both graphs compared, then each side timed in a fresh process of its own (so neither inherits
    the other's freed memory), ours first."""
    model = load(name).eval()
    ids = prompt_ids(model, tokens)
    transcoders = [interp.load_transcoder(model, layer) for layer in range(model.cfg.n_layers)]
    theirs = import_circuit_tracer()[0](ids, their_model(model, transcoders, folder), batch_size=batch)
    out = {"name": name, "tokens": len(ids), "batch": batch,
           **agreement(interp.attribute(model, ids, transcoders, batch_size=batch), theirs)}
    for which in ("ours", "theirs"):
        got = in_fresh_process("benchmarks.graphs_peer", ["--side", which, "--models", name, "--tokens", str(tokens),
                                                          "--batch", str(batch), "--repeats", str(repeats),
                                                          "--threads", str(threads)])
        out[which], out[f"{which}_cpu"], out[f"{which}_mb"] = got["wall"], got["cpu"], got["mb"]
    return out


def report(rows: list[dict]) -> str:
    lines = [f"`interp.attribute` beside circuit-tracer's `attribute` on the same export ({torch.get_num_threads()} "
             "threads): float32, no feature cap, the same batch size", "",
             "| model | tokens | nodes | features | max abs diff | max row rel diff | same zeros | ours s (CPU s) | "
             "circuit-tracer s (CPU s) | ours / theirs wall (CPU) | peak MB ours | peak MB theirs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['tokens']} | {r['nodes']:,} | {r['features']:,} | {r['max_abs']:.1e} | "
                     f"{r['max_row_rel']:.1e} | {'yes' if r['same_support'] else 'no'} | {r['ours']:.2f} ({r['ours_cpu']:.2f}) | "
                     f"{r['theirs']:.2f} ({r['theirs_cpu']:.2f}) | {r['ours'] / r['theirs']:.2f}x "
                     f"({r['ours_cpu'] / r['theirs_cpu']:.2f}x) | {r['ours_mb']:.0f} | {r['theirs_mb']:.0f} |")
    return "\n".join(lines)


def run(models: Sequence[str], tokens: int, batch: int, repeats: int, threads: int = 0) -> str:
    """The report, or one line saying why circuit-tracer was not run."""
    try:
        import_circuit_tracer()
    except ImportError as e:
        return f"circuit-tracer: skipped, {e}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            rows.append(measure(name, tokens, batch, repeats, Path(tmp) / name, threads))
    return report(rows)


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt-4", "sprout-mini"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--side", choices=["ours", "theirs"], help=argparse.SUPPRESS)  # one side, in its own process
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side:
        with tempfile.TemporaryDirectory() as tmp:
            got = side(args.models[0], args.side, args.tokens, args.batch, args.repeats, Path(tmp))
        Path(args.json).write_text(json.dumps(got))
        return json.dumps(got)
    out = run(args.models, args.tokens, args.batch, args.repeats, args.threads)
    print(out)
    return out


if __name__ == "__main__":
    main()
