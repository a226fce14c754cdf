"""The tuner's bucket choice lives in ``perf.session.shapes_section`` (``make plan`` runs it too); this
name stays for the tuner's imports."""

from perf.session.shapes_section import HEADING, BucketRun, bucket_runs, choose, shapes_section

__all__ = ["HEADING", "BucketRun", "bucket_runs", "choose", "shapes_section"]
