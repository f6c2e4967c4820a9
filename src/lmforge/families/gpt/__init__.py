"""The gpt family."""
