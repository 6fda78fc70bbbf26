"""Does it learn: held-out quality after training, by algorithm, reward model and model size."""
