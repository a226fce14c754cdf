"""One stage of a pipeline-parallel ensemble: a ``torch.export`` program on the device Triton assigned.

Copied with its helpers into ``<pipeline>_<stage>/1/`` by the build (docs/PIPELINE.md). The device comes
from ``model_instance_kind`` / ``model_instance_device_id``; tensors move by DLPack, so neighbouring
stages on one GPU never round-trip through the host; requests run as one batch (``batching``). The
program is loaded only if its bytes hash to the config's ``stage_sha256``: no other archive (nor a later
build's under an older config) is ever read by torch. An embedding stage also applies row updates
between batches, logged before they are acknowledged and replayed at ``initialize`` (``update_log``).
"""

import hashlib
import io
import json
import os

from runtime_paths import add_launcher_paths

add_launcher_paths()

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
import update_log  # noqa: E402
from batching import (  # noqa: E402
    InvalidInputError,
    ModelRunError,
    TensorInfo,
    config_parameter,
    error_response,
    read_inputs,
    run_batched,
    with_value_guards,
)
from dtypes import BY_TRITON  # noqa: E402
from embedding_rows import (  # noqa: E402
    UPDATE_INPUTS,
    UPDATE_VERSION,
    apply_row_updates,
    check_ids,
    check_row_updates,
)
from torch.export.passes import move_to_device_pass  # noqa: E402
from torch.utils.dlpack import from_dlpack, to_dlpack  # noqa: E402


def _lookup_inputs(entries: list) -> list:
    """The inputs the stage's program takes (not an embedding stage's update inputs)."""
    return [
        TensorInfo(e["name"], BY_TRITON[e["data_type"]].torch_dtype(), tuple(int(d) for d in e["dims"]))
        for e in entries
        if e["name"] not in UPDATE_INPUTS
    ]


def instance_device(kind: str, device_id: int) -> torch.device:
    """The device Triton assigned this instance; a GPU instance without CUDA is a deployment error."""
    if kind != "GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise pb_utils.TritonModelException(f"instance on GPU {device_id} but torch sees no CUDA device")
    return torch.device("cuda", device_id)


def _from_triton(tensor: "pb_utils.Tensor") -> torch.Tensor:
    return from_dlpack(tensor.to_dlpack())


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.name = config["name"]
        try:
            self.inputs = with_value_guards(_lookup_inputs(config["input"]), config)
        except ValueError as error:
            raise pb_utils.TritonModelException(f"{self.name}: {error}") from error
        self.output_names = [o["name"] for o in config["output"] if o["name"] != UPDATE_VERSION]
        self.device = instance_device(args["model_instance_kind"], int(args["model_instance_device_id"]))
        threads = int(config_parameter(config, "intra_op_thread_count", "0") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(version_dir, config_parameter(config, "stage_program"))
        program, artifact = self._program(path, config_parameter(config, "stage_sha256"))
        # Guards re-check input shapes on every call; batching.validate already checked them per request.
        self.module = program.module(check_guards=False)
        table_names = [n for n in config_parameter(config, "embedding_tables").split(",") if n]
        self.tables = [self.module.get_parameter(n) for n in table_names]
        log_path = os.path.join(version_dir, update_log.LOG_NAME)
        # Its version is answered to each update; its updates belong to this artifact's tables only.
        self.log = update_log.UpdateLog(log_path, self.tables, artifact=artifact)
        if self.tables:
            set_aside = self.log.replay(apply_row_updates)
            if set_aside:
                pb_utils.Logger.log_warn(
                    f"{self.name}: the update log was written against another build of this stage; set "
                    f"aside as {set_aside}, not replayed onto the new weights"
                )

    def _program(self, path: str, built_with: str) -> tuple:
        """The stage's program on its device and its file's SHA-256, which must be ``built_with``."""
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(f"{self.name}: no stage program at {path}")
        if not built_with:
            raise pb_utils.TritonModelException(
                f"{self.name}: its config records no stage_sha256, so {path} cannot be shown to be the "
                "artifact this project's build exported; rebuild the pipeline (python -m exporters build)"
            )
        with open(path, "rb") as handle:
            data = handle.read()
        artifact = hashlib.sha256(data).hexdigest()
        if artifact != built_with:
            raise pb_utils.TritonModelException(
                f"{self.name}: {path} (sha256 {artifact[:12]}) is not the artifact this config was built "
                f"with ({built_with[:12]}): the pipeline was rebuilt since this config was loaded, or the "
                "file was replaced. Load all of its models again from the repository (python -m server load "
                "<model>, stages first) or restart the server, so that every stage comes from the same build"
            )
        program = torch.export.load(io.BytesIO(data))
        return move_to_device_pass(program, self.device), artifact

    def _run(self, batch: dict) -> dict:
        ids = batch[self.inputs[0].name]
        if self.tables:
            check_ids(ids, self.tables, self.inputs[0].name)
        try:
            with torch.inference_mode():
                output = self.module(*(batch[i.name].to(self.device) for i in self.inputs))
        except IndexError as error:
            # Shapes and dtypes were checked, so this is an id outside a table smaller than its
            # declared range: the client's fault (400), as onnxruntime says it (fault matrix row 63).
            raise InvalidInputError(
                f"input '{self.inputs[0].name}' holds a value the model rejects: IndexError: {error}"
            ) from error
        # Contiguous once per batch, so every request's rows are a contiguous view DLPack can hand on.
        return {self.output_names[0]: output.contiguous()}

    def _error(self, error: Exception) -> "pb_utils.InferenceResponse":
        """``error`` for one request, named after this stage (the ensemble's error says which failed)."""
        return error_response(pb_utils, error, f"{self.name}: ")

    def _update(self, given: dict) -> "pb_utils.InferenceResponse":
        """Apply one update request; any failure answers this request alone (lookups still run)."""
        try:
            arrays = read_inputs(given, UPDATE_INPUTS, _from_triton)
            if isinstance(arrays, Exception):
                raise arrays
            update = [arrays[n] for n in UPDATE_INPUTS]
            check_row_updates(self.tables, *update)
            self.log.append(*update)  # durable before it is applied and acknowledged
            rows = apply_row_updates(self.tables, *update)
        except InvalidInputError as error:
            return self._error(error)
        except Exception as error:  # the stage's own failure: INTERNAL, for this request only
            failure = ModelRunError(f"{type(error).__name__}: {error}")
            return self._error(failure)
        try:
            self.log.compact_if_due()
        except OSError as error:  # the update is durable and applied; the log stays as it was
            pb_utils.Logger.log_warn(f"{self.name}: compacting {self.log.path} failed: {error}")
        version = torch.full((rows, 1), self.log.version, dtype=torch.int64)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor.from_dlpack(UPDATE_VERSION, to_dlpack(version))]
        )

    def _mixed(self, given: dict) -> "pb_utils.InferenceResponse":
        """An update that also carries ids to look up is refused whole: the two answers cannot share one
        response (their rows differ)."""
        names = [*UPDATE_INPUTS, *(t.name for t in self.inputs)]
        carried = ", ".join(name for name in names if name in given)
        error = InvalidInputError(
            f"a request either updates rows ({', '.join(UPDATE_INPUTS)}) or looks ids up "
            f"({', '.join(t.name for t in self.inputs)}), not both; this one carries {carried}: send two"
        )
        return self._error(error)

    def execute(self, requests: list) -> list:
        # each request's inputs listed once (pb_utils.get_input_tensor_by_name lists them all per name)
        given = [{tensor.name(): tensor for tensor in r.inputs()} for r in requests]
        lookup_names = [t.name for t in self.inputs]
        updates = {}
        if self.tables:  # updates first, each whole: the lookup batch below sees all of them or none
            for index, inputs in enumerate(given):
                if any(name in inputs for name in UPDATE_INPUTS):
                    mixed = any(name in inputs for name in lookup_names)
                    updates[index] = self._mixed(inputs) if mixed else self._update(inputs)
        lookups = [i for i in range(len(requests)) if i not in updates]
        results = run_batched(
            [read_inputs(given[i], lookup_names, _from_triton) for i in lookups],
            self.inputs,
            self._run,
            concatenate=torch.cat,
        )
        responses = updates
        for index, result in zip(lookups, results, strict=True):
            if isinstance(result, Exception):
                responses[index] = self._error(result)
            else:  # a view of the batch's contiguous output (see _run): handed on by DLPack, not copied
                tensors = [pb_utils.Tensor.from_dlpack(n, to_dlpack(result[n])) for n in self.output_names]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        return [responses[i] for i in range(len(requests))]
