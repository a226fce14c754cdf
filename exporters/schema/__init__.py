"""``models.yaml``, the spec: each section a frozen dataclass that is its own schema (``typed``), read
within bounds (``bounded_yaml``); ``guards`` turns its promises about values into served limits."""
