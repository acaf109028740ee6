"""tandem actors."""
