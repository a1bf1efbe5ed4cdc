"""The `sprout` command: one table of subcommands, each the `main(argv)` of the module that owns it.

It sits above both `sprout.training` and `interp`, so every entry is a plain import that points down:
training and the Hugging Face bridge from `sprout`, the printed analyses from `interp`. Each import runs
inside its entry, when that command is called: `sprout --help` then imports neither torch nor
TransformerLens and answers at once (about 0.05 s against 3-18 s with the imports at the top).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence


def train_main(argv: list[str]) -> int:
    from sprout.training.cli import main
    return main(argv)


def export_main(argv: list[str]) -> int:
    from sprout.files.hf import export_main as main
    return main(argv)


def import_main(argv: list[str]) -> int:
    from sprout.files.hf import import_main as main
    return main(argv)


def lens_main(argv: list[str]) -> int:
    from interp.cli import lens_main as main
    return main(argv)


def heads_main(argv: list[str]) -> int:
    from interp.cli import heads_main as main
    return main(argv)


def rms_main(argv: list[str]) -> int:
    from interp.cli import rms_main as main
    return main(argv)


# subcommand -> (main(argv) -> int, one line of help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
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
    from sprout import keep_freed_memory  # torch and TransformerLens load here, for a command, never for --help

    keep_freed_memory()  # an application may set the process's allocator; `import sprout` never does
    return COMMANDS[name][0](rest) or 0
