"""One training loop for every model, and checkpoints."""
