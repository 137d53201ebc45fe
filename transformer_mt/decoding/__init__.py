"""Search over a model and the Translator that turns text into translations."""
