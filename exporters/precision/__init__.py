"""An fp32 ONNX graph at fp16 or int8; the caller holds each result to its fp32 source."""
