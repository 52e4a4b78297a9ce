"""The Beam layer of the transforms: thin DoFns and PTransforms around the pure modules."""
