"""Pure algorithm math that stages of every family share, in a room that imports no runtime (torch and the
registry type only): token log-probs and masks, the supervised and pairwise losses, pass@k, and the reward models'
ensembles and best-of-n. RL's own math is ``tasks/rl/core_algos.py``."""
