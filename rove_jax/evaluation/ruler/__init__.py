"""RULER long-context retrieval, scored by answer NLL: the suite, its tasks, haystacks and QA."""
