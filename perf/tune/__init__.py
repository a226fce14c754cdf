"""``make tune``: pick the batching configuration for a p99 budget, predicted and verified on the server.

The path of ``python -m perf tune``, in the order it runs: ``cli`` → ``perf.session.model`` (one real
server, the tuner's ``Server``) → ``tuner`` (probe → predict → shortlist → pick → verify, with
``perf.session.probe``) → ``result`` (the saved JSON) → ``report`` (rendered from it) and
``perf.spec_overlay`` (the pick as a spec). The
model it predicts with is ``perf.model``; measurement is ``perf.measure.measurement`` through
``perf.measure.noise``.

Beside it, importing it and never imported by it: ``scenarios`` (the article's two), ``follow``,
``witness`` (perf_analyzer vs our client), ``versus`` (Model Analyzer's pick beside ours, with
``model_analyzer`` and ``yardstick``; ``report`` renders what it saved through ``versus_report``),
and ``steal_check``.
"""
