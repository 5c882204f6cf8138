"""`python -P -m kembed.monitoring [--check]`: write (or check) the chart's dashboards and alerts."""

import sys

from kembed.monitoring.generate import main

sys.exit(main())
