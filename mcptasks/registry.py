"""The tool-author API, at the import path tool authors use: ``from mcptasks.registry import tool``.

The code lives in :mod:`mcptasks.tools.registry`; this name stays stable for tool modules.
"""

from mcptasks.tools.registry import *  # noqa: F403
from mcptasks.tools.registry import __all__  # noqa: F401
