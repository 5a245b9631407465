"""Run configs of the study: reproduce (the comparison) and retrieval (the retrieval study)."""
