"""The `sprout` command: one table of subcommands, each the `main(argv)` of the module that owns it.

It sits above both `sprout.training` and `interp`, so every entry is a plain import that points down:
training and the Hugging Face bridge from `sprout`, the printed analyses from `interp`.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from interp.cli import heads_main, lens_main, rms_main
from sprout import keep_freed_memory
from sprout.files.hf import export_main, import_main
from sprout.training.cli import main as train_main

# subcommand -> (main(argv) -> int, one line of help)
COMMANDS = {
    "train": (train_main, "train a model from a recipe (see --help)"),
    "export-hf": (export_main, "CHECKPOINT OUT_DIR: write a Hugging Face Qwen3 folder"),
    "import-hf": (import_main, "DIR OUT_CHECKPOINT: read a Qwen3 folder back into Sprout"),
    "lens": (lens_main, '"TEXT" --model gpt-4: top-1 token per layer and position (every window of a long text)'),
    "heads": (heads_main, "--model gpt-4 --kind induction: the top heads"),
    "rms": (rms_main, "--model gpt-4: residual-stream RMS per layer"),
}


def usage() -> str:
    lines = ["usage: sprout COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"sprout: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    keep_freed_memory()  # an application may set the process's allocator; `import sprout` never does
    return COMMANDS[name][0](rest) or 0
