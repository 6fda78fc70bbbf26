"""Where the time goes: sampling, training steps, MFU, data parallelism and orchestration."""
