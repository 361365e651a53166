"""The long-horizon evaluation harness (issue 8): ``python -m bench.eval``; see README.md here."""
