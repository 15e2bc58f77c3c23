"""Parley's desktop app (PySide6): a thin view over the engine; one worker thread owns the engine."""
