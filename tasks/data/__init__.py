"""Problems, their verifiers, datasets (validated row by row) and the hidden gold judge."""
