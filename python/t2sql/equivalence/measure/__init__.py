"""`t2sql equivalence --measure`: the check's two errors on derived pairs and on labelled real answers."""
