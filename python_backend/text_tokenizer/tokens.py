"""Text → padded token ids for the encoder, one ``encode_batch`` per execute, bad requests failing alone.

``bounded`` cuts a huge text at whitespace before tokenizing, exactly: BERT's pre-tokenizer splits at
whitespace, so a prefix ending there gives the whole text's first tokens. ``pad_length`` pads to the
smallest bucket, so Triton's dynamic batcher can merge requests of one bucket. No Triton import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

try:  # beside model.py inside the stub
    from batching import InvalidInputError
except ImportError:  # imported as part of the package (unit tests)
    from python_backend.batching import InvalidInputError

WHITESPACE = " \t\n\r"  # what BERT's normaliser keeps as whitespace (control characters it deletes)
CHARS_PER_TOKEN_BUDGET = 64  # first window: max_length × this many characters


@dataclass(frozen=True)
class TokenizedRequest:
    input_ids: np.ndarray  # int64 [rows, pad_length]
    attention_mask: np.ndarray  # int64 [rows, pad_length]
    real_tokens: int  # tokens that are not padding


def decode_texts(array: np.ndarray | None, name: str = "text") -> list[str]:
    """The request's texts, one per row; raises ``InvalidInputError`` naming ``name``."""
    if array is None:
        raise InvalidInputError(f"input '{name}' is missing")
    if array.size == 0:
        raise InvalidInputError(f"input '{name}' holds no texts (empty batch)")
    texts = []
    for row, item in enumerate(array.reshape(-1)):
        if isinstance(item, np.bytes_ | bytes):
            try:
                texts.append(bytes(item).decode("utf-8"))
            except UnicodeDecodeError as error:
                raise InvalidInputError(
                    f"input '{name}' row {row} is not valid UTF-8 (byte {error.start}: {error.reason})"
                ) from error
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise InvalidInputError(f"input '{name}' row {row} is {type(item).__name__}, expected text")
    return texts


class TextTokenizer:
    """A ``tokenizer.json`` with the serving model's truncation, and its padding buckets."""

    def __init__(self, tokenizer_path: str, max_length: int, buckets: Sequence[int] = ()) -> None:
        if buckets and max(buckets) != max_length:
            raise ValueError(f"the last bucket must be max_length ({max_length}), got {list(buckets)}")
        self.tokenizer = Tokenizer.from_file(tokenizer_path)
        # The file's own settings (128 tokens for all-MiniLM-L6-v2) are replaced by the model's limit.
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.no_padding()
        self.max_length = max_length
        self.buckets = tuple(sorted(buckets))
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    def bounded(self, text: str) -> str:
        """``text``, or a prefix ending at whitespace that gives exactly the same tokens."""
        budget = self.max_length * CHARS_PER_TOKEN_BUDGET
        while len(text) > budget:
            prefix = text[:budget]
            cut = max(prefix.rfind(c) for c in WHITESPACE)
            if cut > 0 and self.tokenizer.encode(prefix[:cut]).overflowing:
                return prefix[:cut]
            budget *= 4  # no whitespace, or not enough tokens yet: a wider window
        return text

    def pad_length(self, longest: int) -> int:
        """The smallest bucket that holds ``longest`` (the last is ``max_length``); no buckets: itself."""
        return next((b for b in self.buckets if b >= longest), longest)

    def _pad(self, encodings: Sequence[Encoding]) -> TokenizedRequest:
        lengths = [len(e.ids) for e in encodings]
        width = self.pad_length(max(lengths))
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, (encoding, length) in enumerate(zip(encodings, lengths, strict=True)):
            ids[row, :length] = encoding.ids
            mask[row, :length] = 1
        return TokenizedRequest(ids, mask, sum(lengths))

    def tokenize(self, requests: Sequence[list[str] | Exception]) -> list[TokenizedRequest | Exception]:
        """Tokenize every request's texts in one ``encode_batch``; errors pass through in place."""
        texts = [self.bounded(t) for texts in requests if not isinstance(texts, Exception) for t in texts]
        encodings = self.tokenizer.encode_batch(texts)
        results: list[TokenizedRequest | Exception] = []
        start = 0
        for texts in requests:
            if isinstance(texts, Exception):
                results.append(texts)
            else:
                results.append(self._pad(encodings[start : start + len(texts)]))
                start += len(texts)
        return results
