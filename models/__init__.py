"""tandem models."""
