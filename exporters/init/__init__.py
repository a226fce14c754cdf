"""``python -m exporters init``: a ``models.yaml`` entry read from an artifact, its lengths tried."""
