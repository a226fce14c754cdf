"""``models.yaml``, the spec, and its schema: each section a frozen dataclass that is its own schema
(``typed``), read within bounds (``bounded_yaml``). ``models`` holds the ``models:`` and ``pipelines:``
entries and the whole ``Spec``; ``text_embeddings``, ``shapes`` and the shared ``sections`` hold the
rest; ``guards`` turns what the spec promises about values into limits the serving side enforces."""
