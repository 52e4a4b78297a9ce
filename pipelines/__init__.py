"""Beam entry points and the ``lidarshard`` command."""
