"""An ONNX artifact as every builder writes and checks it: torch → ONNX bytes and the confinement
check (``onnx_files``), onnxruntime's refusals in one line (``ort_failures``), the fp32 torch truth
(``torch_reference``) and the one parity check against it (``parity``), the file's hash
(``file_hash``) and the JSON record kept beside it (``records``)."""
