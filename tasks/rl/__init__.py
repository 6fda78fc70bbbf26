"""RL: the trainer every RL stage runs, its role workers, the algorithm registry, rewards, sequence packing."""
