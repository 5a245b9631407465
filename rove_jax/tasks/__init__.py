"""Synthetic tasks whose answers are known, generated from a seed (numpy only): the training
source `data.source=recall` and the retrieval studies' test samples.

  recall         associative recall (MQAR-style): key-value pairs, then queries; `RecallSpec`
                 ("name=value,..." sizes, the data.path of a recall run)
  recall_tasks   its position-dependent variants: last write wins, the token k after a marker
  recall_chars   their alphabets
"""
