"""Triton model configs as typed dataclasses (``model_config``); a ``models:`` entry's config (``models``)."""
