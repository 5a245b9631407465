"""Run configs shipped with the package: `rove-train --config NAME` (smoke, tiny,
demo, recall_offset, gpt2_124m, gpt2_354m) or `--config path/to/file.py`. `configs/` in a checkout
points here."""
