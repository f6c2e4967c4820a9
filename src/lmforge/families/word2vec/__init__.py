"""The word2vec family."""
