"""Physics: FLOPs, bytes, memory and roofline time as pure functions over numpy arrays (docs/formulas.md)."""
