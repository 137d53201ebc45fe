"""Reading and writing text, the tokenizers and the special ids."""

from transformer_mt.text.textio import (
    MAX_LINE_BYTES,
    READ_BYTES,
    TextError,
    count_lines,
    file_chunks,
    iter_file,
    iter_stream,
    name_write_errors,
    safe_output,
    stdin_chunks,
)
from transformer_mt.text.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerError, decode_stream, encode_stream, train_sentencepiece

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MAX_LINE_BYTES",
    "PAD_ID",
    "READ_BYTES",
    "TextError",
    "Tokenizer",
    "TokenizerError",
    "UNK_ID",
    "count_lines",
    "decode_stream",
    "encode_stream",
    "file_chunks",
    "iter_file",
    "iter_stream",
    "name_write_errors",
    "safe_output",
    "stdin_chunks",
    "train_sentencepiece",
]
