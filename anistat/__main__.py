"""`python -m anistat` = the `anistat` command."""

import sys

from .cli import main

sys.exit(main())
