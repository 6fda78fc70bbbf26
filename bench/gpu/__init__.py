"""On a GPU: the pipeline and the model-level check on a CUDA device, and the lent machine's runner (``run.sh``)."""
