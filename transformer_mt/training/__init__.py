"""The training loop and what it owns: train state, checkpoint policy, stopping, optimizer, EMA, logs."""
