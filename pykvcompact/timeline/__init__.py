"""A session's record over time (record.py) and its PNG plots (plots.py)."""
