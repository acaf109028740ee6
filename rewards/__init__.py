"""tandem rewards."""
