"""`python -m sprout_cli COMMAND ...` is the `sprout` command."""
import sys

from . import main

sys.exit(main())
