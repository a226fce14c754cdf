"""A ``pipelines:`` entry built into the repository and changed while served: the model cut into
balanced stages (``splitter``), the stages as torch modules over named tensors (``stages``), their
Triton configs and the ensemble (``configs``), the build with its checks (``build``) and record
(``record``), and live parameter updates (``live``)."""
