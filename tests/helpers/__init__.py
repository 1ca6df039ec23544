"""What the tests share that is not a fixture: builders of tiny engines and schedulers, process and
server helpers, and the scripts and worker classes the tests run in other processes. Imported as
``tests.helpers.<module>`` (pytest.ini puts the repository root on ``sys.path``)."""

import os

# The repository's root: where a test starts a process that must import this checkout.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
