"""Against TRL: each bench runs alignflow and TRL side by side; a ``*_leg`` module is its TRL leg, run in TRL's own
environment."""
