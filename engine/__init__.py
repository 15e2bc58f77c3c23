"""Parley's engine: a library with no Qt in it. Public names are re-exported from here."""
