"""The Transformer: layers, norms, positions, the output projection, the KV cache, kernels, loss and ensembles."""
