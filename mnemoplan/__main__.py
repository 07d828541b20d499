"""``python -m mnemoplan``: the ``mnemoplan`` command."""

import sys

from mnemoplan.cli.main import main

sys.exit(main())
