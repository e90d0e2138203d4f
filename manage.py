#!/usr/bin/env python
"""Django's command-line utility for mcptasks."""

import os
import sys


def main() -> None:
    """Run administrative tasks."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")
    if sys.argv[1:2] == ["serve"]:
        # `serve` is the development all-in-one: it offers the demo tools unless told otherwise
        # (they are off by default everywhere else; the settings read this before Django starts).
        os.environ.setdefault("MCPTASKS_DEMO_TOOLS", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
