"""Archives from outside the project are opened only here, in a sandbox, and leave it as ONNX.

A ``torch.export`` archive is code, whatever a loader checks: torch 2.13's loader unpickles legacy
entries, evaluates shape expressions with ``sympy``, and FX pastes names from the archive (parameter
names, ``torch.cond`` subgraph names) into the Python it compiles for ``forward``. So an archive the
user brings (a ``torch_export`` source) never reaches torch in our own process. ``outside_archive``
hands it to a child process in a bubblewrap sandbox (``jail``): no network, no capabilities, nothing
writable but its own size-bounded scratch, bounded address space, CPU time and wall-clock time. The
child (``child``) loads the program there, reads its signature, converts it to ONNX with the spec's
tensor names and runs the program on the inputs the parent drew; it sends back, through one pipe the
parent reads within a bound (``frames``), only the ONNX file, the signature as JSON and the program's
outputs as arrays. The parent then treats the ONNX as the model's source, exactly like an ``onnx:``
source, and holds it to those outputs: the repository serves that ONNX, never the archive.

Archives the project writes itself (pipeline stages exported from zoo or ``python:`` modules, their
SHA-256 recorded by the build) are not outside archives: the stage runner loads them in the server.
"""
