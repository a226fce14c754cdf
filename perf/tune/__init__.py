"""``make tune``: pick the batching configuration for a p99 budget, predicted and verified on the server.

The path of ``python -m perf tune``, in the order it runs: ``cli`` → ``perf.session.model`` (one real
server, the tuner's ``Server``) → ``tuner`` (probe → predict → shortlist → pick → verify, with
``perf.session.probe``) → ``result`` (the saved JSON) → ``report`` (rendered from it) and
``perf.spec_overlay`` (the pick as a spec). The
model it predicts with is ``perf.model``; measurement is ``perf.measure.measurement`` through
``perf.measure.noise``.

The tool beside it (perf_analyzer beside our client, ``python -m perf witness``) is ``perf.bench``'s:
a subcommand of its own, which the tuner does not import.
"""
