"""The trainer side: read a rank's manifest. Imports no Beam; torch only in ``loaders.torch``."""
