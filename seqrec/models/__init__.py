"""One file per model; every model implements the contract in `seqrec.models.base`."""
