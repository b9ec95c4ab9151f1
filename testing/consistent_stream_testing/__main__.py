"""``python -m consistent_stream_testing ...``: the ``consistent-stream-testing`` command."""
import sys

from .cli import main

sys.exit(main())
