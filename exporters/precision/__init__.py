"""An fp32 ONNX graph at a lower precision: fp16 (``fp16``), int8 by static or dynamic quantization
(``int8``), with a ``MatMul``'s outlier channels kept in fp32 (``outlier_split``). Each result is held to
its fp32 source by the caller, with the one parity check (``exporters.artifacts.parity``)."""
