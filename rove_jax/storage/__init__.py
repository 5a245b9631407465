"""The path layer: every file a run reads or writes (workdir, checkpoints, metrics, locks,
token caches, prepared datasets, exports, evaluation reports), local or on gs://.

`paths` names and checks locations and holds the file operations; `gcs` is the one module that
talks to Google Cloud Storage (through gcsfs); `lock` is the writer lock built on both.
"""

import os as _os

# Against an emulator (STORAGE_EMULATOR_HOST), gcsfs must not choose its experimental client at
# import: that client probes the server over gRPC first, which an emulator never answers, and
# the run would sit silent. Orbax's own gcsfs instance (through etils.epath) is chosen the same
# way, so this is set before anything imports gcsfs.
if _os.environ.get("STORAGE_EMULATOR_HOST"):
  _os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
