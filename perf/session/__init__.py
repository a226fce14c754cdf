"""Sessions on one real server, used by tune and plan alike: ``model`` (``ModelSession``: one model in
explicit model-control mode, each candidate a reload with a config override), ``pipeline``
(``PipelineSession``: a pipeline's stages as one model) and ``probe`` (the one ramp of open loops
that measures what the prediction needs). They stand on ``perf.measure`` and ``perf.model``.
"""
