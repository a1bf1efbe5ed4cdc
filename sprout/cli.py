"""The `sprout` command: one entry point, each subcommand a `main(argv)` in the module that owns it."""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one line of help); imported only when called, so `sprout train`
# does not pay for plotly and `sprout lens` does not pay for the training code.
COMMANDS = {
    "train": ("sprout.training.cli", "main", "train a model from a recipe (see --help)"),
    "export-hf": ("sprout.hf", "export_main", "CHECKPOINT OUT_DIR: write a Hugging Face Qwen3 folder"),
    "import-hf": ("sprout.hf", "import_main", "DIR OUT_CHECKPOINT: read a Qwen3 folder back into Sprout"),
    "lens": ("experiments.terminal", "lens_main", '"TEXT" --model gpt-4: top-1 token per layer and position'),
    "heads": ("experiments.terminal", "heads_main", "--model gpt-4 --kind induction: the top heads"),
    "rms": ("experiments.terminal", "rms_main", "--model gpt-4: residual-stream RMS per layer"),
}


def usage() -> str:
    lines = ["usage: sprout COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"sprout: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), function)(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
