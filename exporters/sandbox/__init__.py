"""Archives from outside the project are opened only here, in a sandbox, and leave it as ONNX.

A ``torch.export`` archive is code, whatever a loader checks (torch's loader unpickles legacy entries,
evaluates shape expressions with ``sympy``, and FX pastes names from the archive into the Python it
compiles). So ``outside_archive`` hands it to ``child`` in a bubblewrap sandbox (``jail``), which sends
back only the ONNX file, the signature and the program's outputs; the repository serves that ONNX.
Archives the project writes itself (pipeline stages, their SHA-256 recorded) are not outside archives.
"""
