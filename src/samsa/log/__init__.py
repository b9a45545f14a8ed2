"""The partition log: segments, producer state and its snapshots."""
