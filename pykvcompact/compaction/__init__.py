"""Compaction: the policy (when and what), the scheduler, the compactor that executes it, background
preparation, the swap, the rubric probe and its cue, recall of offloaded history; summaries in summary/ and
the session tools in tools/."""
