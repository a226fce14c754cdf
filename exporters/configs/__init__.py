"""Triton model configs: typed dataclasses whose fields match ``model_config.proto`` (``model_config``)
and the config of a ``models:`` entry built from its spec (``models``: batching, placement, warm-up,
threads). Pipelines and text services build theirs from these pieces (``exporters.pipelines.configs``,
``exporters.text.configs``)."""
