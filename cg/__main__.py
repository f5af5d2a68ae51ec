"""`python -m cg …` is the `context-guru` command."""

import sys

from cg.cli import main

sys.exit(main())
