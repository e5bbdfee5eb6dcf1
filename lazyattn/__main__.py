"""`python -m lazyattn ...`: the `lazyattn` command."""

import sys

from lazyattn.cli import main

sys.exit(main())
