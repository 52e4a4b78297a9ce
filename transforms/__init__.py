"""The pipeline's steps: pure numpy/pyarrow functions, grouped by stage; Beam only in ``beam/``.

Nothing outside ``lidarshard.transforms.beam`` imports ``apache_beam``. ``storage`` is the one
storage layer (local paths and URIs) every module reads and writes files through.
"""
