"""``python -m shadowsync.benchmarks.scaling_model``: see :mod:`.report`."""

import sys

from shadowsync.benchmarks.scaling_model.report import main

sys.exit(main())
