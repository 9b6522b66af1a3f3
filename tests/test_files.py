"""Files written whole or not at all (`gmi_drl.files`)."""

import pytest

from gmi_drl.files import replace_atomically, write_text_atomically


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_text_atomically(tmp_path / "metrics.json", "old")

    def fail(tmp):  # a full disk: part written, then the error
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        replace_atomically(path, fail, fsync=True)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    write_text_atomically(path, "new")
    assert path.read_text() == "new" and len(list(tmp_path.iterdir())) == 1
