"""``python -m rockjit.cli`` is the ``rockjit`` command."""
import sys

from . import main

sys.exit(main())
