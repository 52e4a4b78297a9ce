"""One home for I/O: storage backends, Arrow helpers, the samples parts and movable paths."""
