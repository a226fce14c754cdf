"""The studies of ``make perf``, all on the framework (``framework``) and listed in order by ``catalog``:
the batching study first (``batching``, which runs ``study`` and judges with ``batching_goals``,
``analysis``, ``report``, ``plots``, with ``study_spec`` and ``profiles``), then ``pipeline_study``,
``text_study``, ``queue_policy_study`` and ``shape_study``. They stand on ``perf.measure``; tune and
plan borrow ``goals`` and ``plots``.
"""
