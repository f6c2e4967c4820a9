"""Blocks shared by several families.  They take plain ints/floats/bools, never a whole config."""
