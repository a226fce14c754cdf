"""Python-backend models: the python-based ``onnxruntime`` backend and (later) pipeline stage runners.

Files here are copied next to each ``model.py`` they serve (see ``server.backends`` and the repository
builders), because the Python backend's stub imports only what sits beside the model or in the backend
folder: it runs an embedded interpreter that ignores the virtual environment.
"""
