"""What reaches a host from outside: over HTTP, one order, a class of students (serving/__init__.py)."""
