"""The tokenizer stage of a text-embedding ensemble: ``text`` (BYTES) → ``input_ids``, ``attention_mask``,
padded to ``pad_buckets`` up to ``max_seq_length``; real and padded tokens counted in two metrics."""

import json
import os

from runtime_paths import add_launcher_paths

add_launcher_paths()

import triton_python_backend_utils as pb_utils  # noqa: E402
from batching import InvalidInputError, config_parameter, error_response, padding_counters  # noqa: E402
from tokens import TextTokenizer, TokenizedRequest, decode_texts  # noqa: E402

INPUT = "text"


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.name = config["name"]
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer.json")
        length, buckets = config_parameter(config, "max_seq_length"), config_parameter(config, "pad_buckets")
        try:
            self.tokens = TextTokenizer(path, int(length), [int(b) for b in buckets.split(",") if b])
        except Exception as error:  # a missing file, a bad parameter or a broken tokenizer.json
            raise pb_utils.TritonModelException(
                f"{self.name}: cannot set up the tokenizer (max_seq_length={length!r}, "
                f"pad_buckets={buckets!r}, {path}): {error}"
            ) from error
        what = "tokens handed to the encoder: real ones, and with padding"
        self.tokens_counted = padding_counters(pb_utils, "text_tokens_total", what, self.name)

    def _read(self, request) -> list[str] | Exception:
        try:
            tensor = pb_utils.get_input_tensor_by_name(request, INPUT)
            return decode_texts(None if tensor is None else tensor.as_numpy(), INPUT)
        except InvalidInputError as error:
            return error

    def _response(self, result: TokenizedRequest | Exception) -> "pb_utils.InferenceResponse":
        if isinstance(result, Exception):
            return error_response(pb_utils, result, f"{self.name}: ")
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("input_ids", result.input_ids),
                pb_utils.Tensor("attention_mask", result.attention_mask),
            ]
        )

    def _count(self, results: list[TokenizedRequest | Exception]) -> None:
        """The execute's tokens, real and padded: one update per counter, each a call to the server."""
        tokenized = [r for r in results if not isinstance(r, Exception)]
        if tokenized:
            self.tokens_counted.real.increment(sum(r.real_tokens for r in tokenized))
            self.tokens_counted.padded.increment(sum(int(r.input_ids.size) for r in tokenized))

    def execute(self, requests: list) -> list:
        results = self.tokens.tokenize([self._read(r) for r in requests])
        self._count(results)
        return [self._response(r) for r in results]
