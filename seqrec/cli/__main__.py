"""`python -m seqrec.cli ...` (and `torchrun -m seqrec.cli ...`): the same as the `seqrec` command."""

import sys

from seqrec.cli import main

sys.exit(main())
