"""Storage: files written whole or not at all, output folders and their kinds, the writer lock, checks of what
a command reads and writes, and model cards."""
