"""An example user project: a model of the user's own, not from the zoo (see the project README, "Serve
your own model")."""
