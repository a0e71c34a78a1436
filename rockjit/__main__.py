"""``python -m rockjit`` is the ``rockjit`` command."""
import sys

from .cli import main

sys.exit(main())
