"""A run's data identity: what `pipeline.Data.identity` holds and, in words, what changed
between two of them (`describe_identity_change`, for the error of a run resumed on other data).

The identity (a small JSON-serialisable dict) is equal for the same token streams and differs
whenever they differ. For a prepared dataset it is {"source": "prepared", "manifest_sha256",
"path"} (`prepared_format.identity`, plus "max_tokens" when the run caps the streams); for the
other sources {"source", "train_sha256", "val_sha256"}, the sha256 of the token arrays (the
token cache record's digest).
"""

from __future__ import annotations


def describe_identity_change(saved: dict, now: dict) -> str:
  """What differs between two `Data.identity` dicts, in plain words for an error message.

  Args:
    saved: the identity a run recorded (e.g. in its checkpoint metadata).
    now: the identity of the data it would resume on.

  Returns:
    "" when they are equal; else one sentence, e.g. "the prepared dataset gs://b/ds was
    re-prepared (manifest sha256 1234abcd... -> 5678ef01...)".
  """
  saved, now = dict(saved or {}), dict(now or {})
  if saved == now:
    return ""
  if not saved:
    return "the saved run recorded no data identity (it predates identity records)"
  old_src, new_src = saved.get("source"), now.get("source")
  if old_src != new_src:
    return f"the data source changed from {_describe(saved)} to {_describe(now)}"
  changes = []
  if old_src == "prepared":
    old_path, new_path = saved.get("path"), now.get("path")
    old_sha, new_sha = saved.get("manifest_sha256"), now.get("manifest_sha256")
    if old_sha != new_sha and old_path == new_path:
      changes.append(
        f"the prepared dataset {new_path} was re-prepared (manifest sha256 "
        f"{_short(old_sha)} -> {_short(new_sha)})"
      )
    elif old_sha != new_sha:
      changes.append(
        f"the prepared dataset changed from {old_path} (manifest sha256 "
        f"{_short(old_sha)}) to {new_path} (manifest sha256 {_short(new_sha)})"
      )
    elif old_path != new_path:
      changes.append(
        f"the prepared dataset moved from {old_path} to {new_path} (the same "
        f"contents: manifest sha256 {_short(new_sha)})"
      )
    old_caps, new_caps = saved.get("max_tokens") or {}, now.get("max_tokens") or {}
    for split in ("train", "val"):
      if old_caps.get(split) != new_caps.get(split):
        changes.append(
          f"its {split} split's token cap changed from {old_caps.get(split)} to "
          f"{new_caps.get(split)}"
        )
  else:
    for key, what in (("train_sha256", "training"), ("val_sha256", "validation")):
      if saved.get(key) != now.get(key):
        changes.append(
          f"the {what} tokens of the {new_src} corpus changed (sha256 "
          f"{_short(saved.get(key))} -> {_short(now.get(key))})"
        )
  known = {"source", "path", "manifest_sha256", "max_tokens", "train_sha256", "val_sha256"}
  for key in sorted((set(saved) | set(now)) - known):
    if saved.get(key) != now.get(key):
      changes.append(f"its {key} changed from {saved.get(key)!r} to {now.get(key)!r}")
  return "; ".join(changes) or f"the data identity changed from {saved} to {now}"


def _describe(identity: dict) -> str:
  source = identity.get("source")
  if source == "prepared":
    return (
      f"the prepared dataset {identity.get('path')} (manifest sha256 "
      f"{_short(identity.get('manifest_sha256'))})"
    )
  return f"the {source} corpus (training tokens sha256 {_short(identity.get('train_sha256'))})"


def _short(digest) -> str:
  return f"{digest[:8]}..." if isinstance(digest, str) else repr(digest)
