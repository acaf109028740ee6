"""tandem learner."""
