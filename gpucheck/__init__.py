"""The GPU check (docs/GPU.md) on the lent machine as it comes, bare and offline: this package imports only
what that machine has, the carried wheels and the project's pydantic-free modules (never PyTriton's
Python API); the rehearsal enforces it."""
