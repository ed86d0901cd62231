"""Validation: the published dataset, predict, the engine fit, cross-validation and local measurement."""
