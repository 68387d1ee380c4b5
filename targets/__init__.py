"""Adapters that drive real engines (issue 4); the model itself is the first target."""
