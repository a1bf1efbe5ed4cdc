"""`python -m interp.saes.training`: the dictionaries' command line (`interp.saes.training.cli`)."""
import sys

from .cli import main

sys.exit(main())
