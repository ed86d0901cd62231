"""Efficiencies: what fraction of datasheet peaks a device and an engine achieve, and where that came from."""
