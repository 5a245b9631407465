"""files.py: which files a corpus path names (a file, a directory, a glob)."""

import pytest

from rove_jax.data import files


@pytest.mark.parametrize("name", ["runs[1]", "what?", "all*", "[abc]"])
def test_an_existing_directory_with_glob_characters_is_read_literally(tmp_path, name):
  corpus = tmp_path / name
  (corpus / "sub").mkdir(parents=True)
  (corpus / "a.txt").write_text("one")
  (corpus / "sub" / "b.txt").write_text("two")
  (tmp_path / "other.txt").write_text("not in the corpus")  # what `what?` or `all*` might match
  found, named = files.resolve_files(str(corpus), (".txt",), "data.path")
  assert found == [str(corpus / "a.txt"), str(corpus / "sub" / "b.txt")] and not named
  # a file whose name holds them is the file itself
  single = tmp_path / f"{name}.txt"
  single.write_text("three")
  assert files.resolve_files(str(single), (".txt",), "data.path") == ([str(single)], True)


def test_a_path_that_does_not_exist_is_still_a_glob(tmp_path):
  for n in ("x1.txt", "x2.txt", "y.txt"):
    (tmp_path / n).write_text(n)
  found, named = files.resolve_files(str(tmp_path / "x?.txt"), (".txt",), "data.path")
  assert found == [str(tmp_path / "x1.txt"), str(tmp_path / "x2.txt")] and not named
  with pytest.raises(ValueError, match="matched no files"):
    files.resolve_files(str(tmp_path / "z*.txt"), (".txt",), "data.path")
