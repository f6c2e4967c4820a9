"""The elmo family."""
