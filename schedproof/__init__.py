"""Command line and reports for schedproof: the only layer that prints."""
