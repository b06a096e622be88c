"""Presentation: rich renderables, CSV text and JSON-able dicts. Never prints, never reads files.

One module per command (``compute``, ``properties``, ``sweep``, ``probe``) plus ``common`` for
what they share (formats, table-to-text, CSV, JSON).
"""
