"""``make tune``: pick the batching configuration for a p99 budget, predicted and verified on the server.

The path of ``python -m perf tune``, in the order it runs: ``cli`` → ``perf.session.model`` (one real
server, the tuner's ``Server``) → ``tuner`` (probe → predict → shortlist → pick → verify, with
``perf.session.probe``) → ``result`` (the saved JSON) → ``report`` (rendered from it) and
``perf.spec_overlay`` (the pick as a spec). The
model it predicts with is ``perf.model``; measurement is ``perf.measure.measurement`` through
``perf.measure.noise``.

The tools beside it (scenarios, follow, the witnesses, the steal check) are ``perf.bench``'s: they
import the tuner, it imports none of them (they reach its run through ``cli.Beside``).
"""
