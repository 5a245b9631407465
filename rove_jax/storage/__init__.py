"""The path layer: every file a run reads or writes (workdir, checkpoints, metrics, locks,
token caches, prepared datasets, exports, evaluation reports), local or on gs://.

`paths` names and checks locations and holds the file operations; `gcs` is the one module that
talks to Google Cloud Storage (through gcsfs); `lock` is the writer lock built on both.
"""
