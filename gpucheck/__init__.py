"""The GPU check (docs/GPU.md): the project's GPU claims measured on the lent machine as it comes. That
machine is bare and offline and only the working tree plus a folder of wheels travel, so this package
imports only the standard library, what that machine has, the carried packages and the project's
pydantic-free modules (never PyTriton's Python API); the rehearsal enforces it."""
