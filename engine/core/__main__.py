"""``python -m engine.core FD``: an EngineCore process (engine_core_proc.main); FD holds its
launch spec (engine/core/launch.py).

Its own entry module, so that ``engine_core_proc`` is imported once, as itself: run as ``-m``
it was also ``__main__``, a second copy of every class beside the one ``engine`` imports
(and runpy warned about it on every start).
"""

import logging
import os
import sys

from engine.core.engine_core_proc import main

code = main(sys.argv[1:])
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # the channel is closed and nothing else needs saving: skip torch's slow teardown
