"""``python -m exporters init``: a ready ``models.yaml`` entry read from the user's artifact (``entry``),
with the lengths of its variable axes tried as the build tries them (``shapes``)."""
