"""What every stage shares: params schema and validation, stage registry, training, tracking, artifacts, Ray."""
