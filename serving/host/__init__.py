"""The engine host: one engine in its own process, and every client's way to it (serving/__init__.py)."""
