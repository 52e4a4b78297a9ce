"""The pipeline's steps: pure numpy/pyarrow functions first, thin Beam wrappers in ``*_beam`` modules.

Modules without ``_beam`` in their name never import ``apache_beam``.
"""
