"""A ``pipelines:`` entry: the model cut into balanced stages, built, checked, recorded and updated live."""
