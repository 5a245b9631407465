"""The paper reproduction of `make reproduce` (outside the wheel): statistics, the retrieval
study, the claims table and the write-up of results/, and the paper-scale recipe."""
