"""Unit tests of the pure protocol layer (no Django, no database)."""
