"""Specs and readers: hardware, models and formats as validated pydantic models, from YAML or config.json."""
