"""`python -m sprout.train ...` (and `torchrun -m sprout.train ...`): the entry point of `sprout train`, kept
for the commands people already type. The training code lives in `sprout.training`; `import sprout` does
not import this module."""
import sys

from sprout.training.cli import main, parse_args
from sprout.training.loop import train

__all__ = ["main", "parse_args", "train"]

if __name__ == "__main__":
    sys.exit(main())
