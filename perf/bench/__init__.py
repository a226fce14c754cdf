"""The tools beside the tuner, never imported by it: the article's scenarios (``scenarios``), a rate
step followed with reloads (``follow``), perf_analyzer beside our client (``witness``), Model
Analyzer's pick beside ours (``versus``, with ``model_analyzer``, ``yardstick`` and the report section
``versus_report``) and the host-steal check (``steal_check``); ``cli`` wires them into
``python -m perf``.
"""
