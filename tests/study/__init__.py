"""Tests of study/ and reproduce.py."""
