"""A ``text_embeddings:`` entry: encoder ONNX from packaged weights, tokenizer stage, ensemble, configs."""
