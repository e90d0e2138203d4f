"""Environment the test process needs before Django's settings are read (``-p`` in ``addopts``).

pytest-django imports the settings before any ``conftest.py``, so this early plugin is where
the tests turn on what production leaves off: the demo tools (``MCPTASKS_DEMO_TOOLS``, off by
default) that many tests call. Server processes get it from :func:`tests.support.servers.make_stack`.
"""

from __future__ import annotations

import os

os.environ.setdefault("MCPTASKS_DEMO_TOOLS", "1")
