"""The Beam layer of the transforms: thin DoFns and PTransforms around the pure modules.

Importing it registers Beam's ``FileSystems`` as a ``lidarshard.transforms.io.storage`` backend
(``storage`` submodule), so pipeline code and its workers read URIs the way Beam does.
"""

from lidarshard.transforms.beam import filesystems as _storage  # noqa: F401  (registers the backend)
