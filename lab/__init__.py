"""The lab: measured experiments that make the bottleneck move, plus the inspector and run log."""
