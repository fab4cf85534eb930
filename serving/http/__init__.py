"""The class kitchen's HTTP server: an adapter over a host (serving/__init__.py)."""
