"""`python -m gymflow.workers.cli`."""

import sys

from gymflow.workers.cli.main import main

sys.exit(main())
