"""tasks/storage.py on local disk: a published directory is never missing or half there while it is
replaced, and what it replaced is gone."""

import threading

from tasks.storage import publish_dir


def test_a_directory_replaced_many_times_is_never_seen_missing(tmp_path):
    final = tmp_path / "model"
    missing, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            if final.exists() and not (final / "weights").exists():
                missing.append("half")
            if not final.exists() and (tmp_path / "seen").exists():
                missing.append("gone")

    for i in range(60):
        tmp = tmp_path / f".model.{i}"
        tmp.mkdir()
        (tmp / "weights").write_text(str(i))
        publish_dir(tmp, final)
        if i == 0:
            (tmp_path / "seen").write_text("")
            watcher = threading.Thread(target=watch)
            watcher.start()
    stop.set()
    watcher.join()
    assert missing == [] and (final / "weights").read_text() == "59"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "seen"]  # no old copy or temp left
