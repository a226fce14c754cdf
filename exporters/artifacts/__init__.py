"""An ONNX artifact as every builder writes and checks it: the file, its parity with torch, its record."""
