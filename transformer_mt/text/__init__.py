"""Reading and writing text, the tokenizers and the special ids."""
