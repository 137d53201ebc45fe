"""Reading and writing text, the tokenizers and the special ids."""

from transformer_mt.text.languages import (
    check_language_code,
    check_tag,
    is_multilingual,
    language_tag,
    source_tags,
    tag_symbols,
    target_languages,
    training_corpora,
)
from transformer_mt.text.specials import BOS_ID, DEFAULT, EOS_ID, NO_ID, PAD_ID, UNK_ID, SpecialIds
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
from transformer_mt.text.tokenizer import Tokenizer, TokenizerError, decode_stream, encode_stream, train_sentencepiece

__all__ = [
    "BOS_ID",
    "DEFAULT",
    "EOS_ID",
    "MAX_LINE_BYTES",
    "NO_ID",
    "PAD_ID",
    "READ_BYTES",
    "SpecialIds",
    "TextError",
    "Tokenizer",
    "TokenizerError",
    "UNK_ID",
    "check_language_code",
    "check_tag",
    "count_lines",
    "decode_stream",
    "encode_stream",
    "file_chunks",
    "iter_file",
    "is_multilingual",
    "iter_stream",
    "language_tag",
    "name_write_errors",
    "safe_output",
    "source_tags",
    "stdin_chunks",
    "tag_symbols",
    "target_languages",
    "train_sentencepiece",
    "training_corpora",
]
