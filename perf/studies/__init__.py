"""The studies of ``make perf``, on ``framework`` and listed in order by ``perf.cli.studies``."""
