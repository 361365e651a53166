"""Chat formatting: the model's chat template, tool-call parsing, and checks of the messages callers hand in."""
