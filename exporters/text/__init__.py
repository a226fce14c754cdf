"""A ``text_embeddings:`` entry built into the repository: the encoder ONNX from packaged real weights,
the tokenizer stage and the ensemble (``embedding``), and the Triton configs of the three (``configs``)."""
