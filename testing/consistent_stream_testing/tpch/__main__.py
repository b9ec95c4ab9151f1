"""``python -m consistent_stream_testing.tpch tpch-generate|tpch-refresh ...``."""
import sys

from .cli import main

sys.exit(main())
