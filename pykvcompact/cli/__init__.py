"""The command line (main.py: ``pykvcompact demo | agent | models | bench | serve | chat``), the chat UI and the
demos."""
