"""tandem launch."""
