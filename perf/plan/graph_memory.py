"""Memory per instance counted from the model's graph on the meta device, without building it: a model
too big for this host (tables of 40 GB) must still be planned here. Activations are every operator's
output at once, an upper bound (onnxruntime reuses buffers), so the figure errs on the side of fitting."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from exporters.schema.models import ModelSpec
from exporters.sources.inputs import draw_inputs
from exporters.zoo import ZOO

WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}  # a weighted op's weight (int8: quantized)
FLOAT_BYTES = {"fp32": 4, "fp16": 2, "int8": 4}  # tables, biases, activations (int8 leaves them fp32)
WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
TABLES = (nn.Embedding, nn.EmbeddingBag)
HOST_SHARE = 0.5  # a model whose fp32 parameters exceed this share of the host's memory is not built
PROXY_ROWS = 10_000  # the rows of each table of the compute proxy (``compute_proxy``)
log = logging.getLogger(__name__)


class GraphMemoryError(ValueError):
    """The model's memory cannot be counted from its graph; the message says why."""


@dataclass(frozen=True)
class Table:
    """One embedding table: its module path, ``rows × dim``, and the rows a request looks up in it."""

    name: str
    rows: int
    dim: int
    lookups: float = 1.0

    def bytes(self, precision: str) -> int:
        return self.rows * self.dim * FLOAT_BYTES[precision]

    def request_bytes(self, precision: str) -> float:
        """The bytes of the rows one request looks up here (what leaves the table's GPU)."""
        return self.lookups * self.dim * FLOAT_BYTES[precision]


@dataclass(frozen=True)
class GraphMemory:
    """Element counts of one model's graph; bytes per precision (each stores weights, tables and the rest
    differently, as ``exporters.precision.int8`` quantizes only the weighted ops)."""

    weights: int  # elements of the weighted ops' weights
    other: int  # elements of the other float parameters and buffers
    tables: tuple[Table, ...]
    activations: int  # float elements written by one forward at ``batch``
    fixed_bytes: int  # integer buffers and activations (ids, indices): the same in every precision
    batch: int

    def table_bytes(self, precision: str) -> int:
        return sum(t.bytes(precision) for t in self.tables)

    def parameter_bytes(self, precision: str) -> int:
        weights, other = self.weights * WEIGHT_BYTES[precision], self.other * FLOAT_BYTES[precision]
        return weights + other + self.table_bytes(precision)

    def activation_bytes(self, precision: str) -> int:
        return self.activations * FLOAT_BYTES[precision] + self.fixed_bytes

    def instance_bytes(self, precision: str) -> int:
        """One instance at its largest batch: parameters plus activations."""
        return self.parameter_bytes(precision) + self.activation_bytes(precision)

    @property
    def tables_dominate(self) -> bool:
        """The tables are at least half the parameters: spreading them over GPUs is worth planning."""
        return bool(self.tables) and 2 * self.table_bytes("fp32") >= self.parameter_bytes("fp32")


class _Writes(TorchDispatchMode):
    """Adds up what every operator writes (an output aliasing an input is a view) and each table's lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.float_elements = 0
        self.fixed_bytes = 0
        self.lookups: dict[int, int] = {}  # id of a table's weight -> elements its lookups wrote

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outputs = out if isinstance(out, tuple | list) else (out,)
        for ret, tensor in zip(returns, outputs, strict=False):
            if not isinstance(tensor, torch.Tensor) or ret.alias_info is not None:
                continue
            if tensor.is_floating_point():
                self.float_elements += tensor.numel()
            else:
                self.fixed_bytes += tensor.numel() * tensor.element_size()
        if func in (torch.ops.aten.embedding.default, torch.ops.aten._embedding_bag.default):
            weight = args[0]  # both take the table first
            self.lookups[id(weight)] = self.lookups.get(id(weight), 0) + outputs[0].numel()
        return out


def graph_memory(spec: ModelSpec) -> GraphMemory:
    """``spec``'s parameters, tables and activations at ``max_batch_size``; nothing built or allocated."""
    if spec.source_kind not in ("zoo", "python"):
        raise GraphMemoryError(
            f"{spec.name}: memory from the graph needs a torch module (a zoo or python source), "
            f"not a {spec.source_kind} source"
        )
    try:
        with torch.device("meta"):  # no storage, whatever its size
            if spec.source_kind == "zoo":
                module = ZOO[spec.source].create(spec.options, spec.seed).eval()
            else:
                from exporters.sources.load import load_source

                module = load_source(spec).module.eval()  # type: ignore[attr-defined]
        # inputs of the largest batch, as the exporters draw them, on the meta device
        inputs = [torch.from_numpy(a).to("meta") for a in draw_inputs(spec, spec.max_batch_size, 0, module)]
    except Exception as error:  # a user factory may refuse the meta device in any way
        raise GraphMemoryError(f"{spec.name}: cannot build it on the meta device: {error}") from error
    weights = 0
    tables: list[tuple[str, nn.Module]] = []
    rest = list(module.buffers())  # and every parameter neither a table nor a weighted op's weight
    for name, param in module.named_parameters():  # each shared parameter once
        owner = name.rpartition(".")[0]
        child = module.get_submodule(owner)
        if isinstance(child, TABLES) and param is child.weight:
            tables.append((owner, child))
        elif isinstance(child, WEIGHTED) and param is child.weight:
            weights += param.numel()
        else:
            rest.append(param)
    other = sum(t.numel() for t in rest if t.is_floating_point())
    fixed = sum(t.numel() * t.element_size() for t in rest if not t.is_floating_point())
    writes = _Writes()
    try:
        with torch.no_grad(), writes:
            module(*inputs)
    except Exception as error:  # an op without a meta kernel, a data-dependent branch
        raise GraphMemoryError(
            f"{spec.name}: its forward does not run on the meta device: {error}"
        ) from error
    batch = spec.max_batch_size
    found = tuple(
        Table(name, rows, dim, writes.lookups.get(id(child.weight), 0) / (batch * dim))
        for name, child in tables
        for rows, dim in (child.weight.shape,)
    )
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    return GraphMemory(weights, other, found, writes.float_elements, fixed + input_bytes, batch)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_big_to_build(spec: ModelSpec, memory: GraphMemory) -> str:
    """Why ``spec`` is not built here ("": it is): a build holds the torch module and its export at once."""
    needed, host = memory.parameter_bytes("fp32"), host_memory_bytes()
    if needed <= HOST_SHARE * host:
        return ""
    return (
        f"{spec.name} holds {needed / 2**30:.1f} GiB of fp32 parameters, more than "
        f"{HOST_SHARE:.0%} of this host's {host / 2**30:.1f} GiB: too big to build here"
    )


def count(model: ModelSpec) -> tuple[GraphMemory | None, str]:
    """A model's memory from its graph (None: no torch module), and why it is too big to build here ("")."""
    try:
        memory = graph_memory(model)
    except GraphMemoryError as error:
        log.info("memory measured on the export: %s", error)
        return None, ""
    return memory, too_big_to_build(model, memory)


def compute_proxy(spec: ModelSpec) -> ModelSpec | None:
    """``spec`` with every table capped at ``PROXY_ROWS`` rows (a lookup costs the same in a small table),
    under the model's own name; None where the spec has no ``table_sizes`` knob."""
    sizes = spec.options.get("table_sizes")
    if spec.source_kind != "zoo" or not isinstance(sizes, list | tuple):
        return None
    capped = [min(int(size), PROXY_ROWS) for size in sizes]
    return replace(spec, options={**spec.options, "table_sizes": capped})


def onnx_instance_bytes(path: Path, batch: int) -> int:
    """One instance of the exported ONNX file at ``batch``: its initializers plus every tensor ONNX shape
    inference gives (an unknown axis other than the batch counts as 1, an underestimate the report names)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph

    def size(elem_type: int, dims) -> int:
        return math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize

    params = sum(size(t.data_type, t.dims) for t in graph.initializer)
    initializers = {t.name for t in graph.initializer}
    for tensor in graph.input:
        dims = tensor.type.tensor_type.shape.dim
        if tensor.name not in initializers and dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = batch
    inferred = onnx.shape_inference.infer_shapes(model).graph
    # a quantized weight's DequantizeLinear is fused into its int8 op by onnxruntime: not an activation
    fused = {
        node.output[0]
        for node in graph.node
        if node.op_type == "DequantizeLinear" and node.input[0] in initializers
    }
    activations = 0
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        if value.name in initializers | fused or not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        activations += size(tensor.elem_type, dims)
    return params + activations
