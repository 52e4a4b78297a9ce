"""The Beam layer of the transforms: thin DoFns and PTransforms around the pure modules. Files are read,
written and listed through ``lidarshard.transforms.io.storage`` (``pyarrow.fs``), in the launcher and on
every worker alike."""
