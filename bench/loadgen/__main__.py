"""`python -m bench.loadgen`."""

import sys

from bench.loadgen.command_line import main

if __name__ == "__main__":
    sys.exit(main())
