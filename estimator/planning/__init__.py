"""Planning: which hardware, how many, in which format and at what cost; disaggregated serving."""
