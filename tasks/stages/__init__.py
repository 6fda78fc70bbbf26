"""Stage entry points, one module per stage kind; the kinds are declared in ``tasks/common/config.py``."""
