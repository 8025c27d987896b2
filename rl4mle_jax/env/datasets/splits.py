"""Deterministic splits, checksums, and the reward view carved from a public train split.

The reward view has the same file layout as the public (test) view, so one agent program runs
in both: ``train.csv`` (the rest of public train), ``test.csv`` (held-out rows, public test
columns only), ``sample_submission.csv`` (public sample's columns), ``description.md`` and the
public extra files; the held-out answers go to a private directory next to it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

REWARD_SPLIT_VERSION = 1


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_SHA_MEMO: dict[tuple, str] = {}


def sha256_file_cached(path: Path) -> str:
    """`sha256_file`, memoised per process on (path, inode, size, mtime): a task's files are
    hashed once per process however often its fingerprint is asked for."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        if len(_SHA_MEMO) > 100_000:
            _SHA_MEMO.clear()
        _SHA_MEMO[key] = sha256_file(path)
    return _SHA_MEMO[key]


def checksums(root: Path, subdirs: Iterable[str]) -> dict[str, str]:
    """sha256 of every file under root/subdir, keyed by path relative to root (sorted)."""
    out = {}
    for sub in subdirs:
        base = root / sub
        if not base.exists():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file():
                out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def verify_checksums(root: Path, recorded: dict[str, str]) -> list[str]:
    """Relative paths whose file is absent or whose sha256 differs from `recorded`."""
    bad = []
    for rel, digest in recorded.items():
        p = root / rel
        if not p.is_file() or sha256_file(p) != digest:
            bad.append(rel)
    return bad


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """Byte-stable CSV: no index, '\\n' line ends, shortest round-trip float repr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, lineterminator="\n")


def split_indices(n: int, fraction: float, seed: int,
                  fold: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held_out) row positions, each in increasing order; held-out is round(n*fraction).

    Fold 0 holds out the first block of a permutation drawn with `seed`; fold k >= 1 the k-th
    next block of the same permutation, so the held-out rows of folds 0, 1, ... are disjoint
    while they fit ((k+1) blocks <= n rows). A fold past that holds out rows drawn with
    seed + k from outside fold 0's (all of them where fewer than a block remain, i.e. a share
    over one half): still disjoint from fold 0, not from the other folds."""
    n_hold = int(round(n * fraction))
    if not 0 < n_hold < n:
        raise ValueError(f"cannot hold out {fraction:.0%} of {n} rows")
    if fold < 0:
        raise ValueError(f"fold must be >= 0, got {fold}")
    perm = np.random.default_rng(seed).permutation(n)
    if (fold + 1) * n_hold <= n:
        hold = perm[fold * n_hold:(fold + 1) * n_hold]
    else:
        rest = perm[n_hold:]
        hold = rest[np.random.default_rng(seed + fold).permutation(len(rest))[:n_hold]]
    return np.setdiff1d(np.arange(n), hold), np.sort(hold)


def one_hot(labels: pd.Series, classes: list[str], what: str) -> pd.DataFrame:
    labels = labels.astype(str)
    unknown = sorted(set(labels) - set(classes))
    if unknown:
        raise ValueError(f"{what}: labels {unknown[:5]} are not among the target columns")
    return pd.DataFrame({c: (labels == c).astype(int).to_numpy() for c in classes})


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class _Table:
    """Rows of a CSV (cells kept as the exact text) or of a JSON list of records."""

    def __init__(self, columns: list[str], rows: list, is_json: bool):
        self.columns, self.rows, self.is_json = columns, rows, is_json

    @classmethod
    def read(cls, path: Path) -> _Table:
        if path.suffix == ".json":
            records = json.loads(path.read_text())
            return cls(list(records[0].keys()) if records else [], records, True)
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader)
            return cls(header, list(reader), False)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, idx: np.ndarray) -> _Table:
        return _Table(self.columns, [self.rows[i] for i in idx], self.is_json)

    def column(self, name: str) -> list:
        if self.is_json:
            return [r.get(name) for r in self.rows]
        j = self.columns.index(name)
        return [r[j] for r in self.rows]

    def select(self, names: list[str]) -> _Table:
        if self.is_json:
            return _Table(names, [{k: r.get(k) for k in names} for r in self.rows], True)
        js = [self.columns.index(n) for n in names]
        return _Table(names, [[r[j] for j in js] for r in self.rows], False)

    def write(self, path: Path) -> None:
        if self.is_json:
            path.write_text(json.dumps(self.rows, indent=1))
            return
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(self.columns)
            w.writerows(self.rows)


def _columns_of(path: Path | None) -> list[str] | None:
    if path is None or not path.exists():
        return None
    if path.suffix == ".json":
        records = json.loads(path.read_text())
        return list(records[0].keys()) if records else None
    return [str(c) for c in pd.read_csv(path, nrows=0).columns]


def carve_reward_split(*, public_dir: Path, out_dir: Path, train_file: str, test_file: str,
                       sample_submission_file: str | None, id_column: str,
                       target_columns: list[str], label_column: str | None = None,
                       fraction: float = 0.2, seed: int = 0, fold: int = 0,
                       source_sha256: str | None = None) -> dict:
    """Write ``out_dir/public`` and ``out_dir/private/answers.csv``; returns the manifest.

    `fold` (see `split_indices`): 0 is the reward split; k >= 1 a selection split whose
    held-out rows are disjoint from the reward split's (and from the other folds' while they
    fit), so a program picked for its reward-split score meets fresh answers there.

    Idempotent: if ``out_dir/manifest.json`` records the same source train checksum and
    parameters (and `source_sha256`, the digest of every public file the view copies) and all
    files verify, nothing is rewritten. Written atomically (temp dir +
    rename) so concurrent callers never see a half-written view.
    """
    train_path = public_dir / train_file
    params = dict(version=REWARD_SPLIT_VERSION, train_sha256=sha256_file(train_path),
                  fraction=fraction, seed=seed, id_column=id_column,
                  target_columns=list(target_columns), label_column=label_column)
    if fold:
        params["fold"] = fold
    if source_sha256 is not None:
        params["source_sha256"] = source_sha256
    manifest_path = out_dir / "manifest.json"
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("params") == params and not verify_checksums(out_dir, old["checksums"]):
            return old

    train = _Table.read(train_path)
    if id_column not in train.columns:
        raise ValueError(f"{train_path}: id column {id_column!r} not found "
                         f"(columns {list(train.columns)[:10]})")
    keep, hold = split_indices(len(train), fraction, seed, fold)
    rest, held = train.take(keep), train.take(hold)

    test_path = public_dir / test_file
    test_cols = _columns_of(test_path)
    if test_cols is None:
        drop = set(target_columns) | ({label_column} if label_column else set())
        test_cols = [c for c in train.columns if c not in drop]
    test_cols = [c for c in test_cols if c in train.columns]
    if id_column not in test_cols:
        test_cols = [id_column, *test_cols]

    held_ids = held.column(id_column)
    if all(c in train.columns for c in target_columns):
        answers = pd.DataFrame({c: held.column(c) for c in [id_column, *target_columns]})
    elif label_column and label_column in train.columns:
        answers = pd.concat([pd.DataFrame({id_column: held_ids}),
                             one_hot(pd.Series(held.column(label_column)), list(target_columns),
                                     f"{train_path} column {label_column!r}")], axis=1)
    else:
        raise ValueError(f"{train_path}: neither the target columns {target_columns} nor a "
                         f"label column are in train, so the reward split has no answers; for "
                         f"class probabilities add \"label_column\": \"<the train column holding "
                         f"the class>\" to task.json (label_column is {label_column!r})")
    if answers[target_columns].map(lambda v: isinstance(v, bool)).any().any():
        answers[target_columns] = answers[target_columns].astype(int)

    sample_path = public_dir / sample_submission_file if sample_submission_file else None
    sample_cols = _columns_of(sample_path) or [id_column, *target_columns]
    fill = {}
    if sample_path is not None and sample_path.exists():
        first = pd.read_csv(sample_path, dtype=str, keep_default_na=False, nrows=1)
        fill = {c: (first[c].iloc[0] if len(first) else "0") for c in first.columns}
    sample = pd.DataFrame({c: (held.column(c) if (c == id_column or c in test_cols)
                               else [fill.get(c, "0")] * len(held))
                           for c in sample_cols})

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".reward-", dir=out_dir.parent))
    pub, priv = tmp / "public", tmp / "private"
    pub.mkdir()
    priv.mkdir()
    rest.write(pub / train_file)
    held.select(test_cols).write(pub / test_file)
    write_csv(sample, pub / (sample_submission_file or "sample_submission.csv"))
    write_csv(answers, priv / "answers.csv")
    table_names = {train_file, test_file, sample_submission_file}
    for p in sorted(public_dir.iterdir()):
        # Archives of the train/test tables would leak the held-out labels.
        if p.name in table_names or p.name.startswith(("train.", "test.")):
            continue
        if p.is_dir():
            shutil.copytree(p, pub / p.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(p), str(pub / p.name))
    manifest = dict(params=params, n_train=len(rest), n_test=len(held),
                    checksums=checksums(tmp, ["public", "private"]))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        os.replace(tmp, out_dir)
    except OSError:  # another writer won the race; theirs is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    return json.loads(manifest_path.read_text())
