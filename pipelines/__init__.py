"""Beam entry points and the ``lidarshard`` command."""

#: Set to 1 to get the full Python/Beam traceback of a failed run (same as ``--debug``).
DEBUG_ENV = "LIDARSHARD_DEBUG"
