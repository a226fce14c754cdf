"""An example user project: a model of the user's own, not from the zoo (see ../README.md)."""
