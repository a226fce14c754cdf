"""The studies of ``make perf``: the batching study (``study``, ``analysis``, ``goals``, ``report``,
``plots``, with ``study_spec`` and ``profiles``), the framework the others stand on (``framework``)
and the others (``pipeline_study``, ``text_study``, ``queue_policy_study``, ``shape_study``), listed
in order by ``catalog``. They stand on ``perf.measure``; tune and plan borrow ``goals`` and ``plots``.
"""
