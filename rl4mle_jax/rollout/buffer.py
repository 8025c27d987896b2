"""Experience log (append-only JSON lines that survive a crash) and the best-solutions buffer."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any


class ExperienceLog:
    """Append-only JSONL file, one record per finished episode, keyed by `episode_id`.

    Each line is written whole and fsync'ed, so a SIGKILL can at worst leave one partial last
    line; opening the log truncates it away. Records whose episode id is already present are
    refused, so a resumed run never duplicates an episode.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._ids: set[int] = set()
        self._repair_and_index()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_and_index(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        keep = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1]
        if len(keep) != len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(len(keep))
        for lineno, line in enumerate(keep.decode("utf-8").splitlines(), 1):
            try:
                self._ids.add(int(json.loads(line)["episode_id"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{self.path}:{lineno}: not an experience record ({e})") from e

    def __contains__(self, episode_id: int) -> bool:
        return episode_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def next_episode_id(self) -> int:
        return max(self._ids) + 1 if self._ids else 0

    def append(self, record: dict[str, Any]) -> None:
        episode_id = int(record["episode_id"])
        if episode_id in self._ids:
            raise ValueError(f"episode {episode_id} is already in {self.path}")
        self._fh.write(json.dumps(record, default=_json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._ids.add(episode_id)

    def close(self) -> None:
        self._fh.close()

    @staticmethod
    def read(path: str | os.PathLike) -> list[dict[str, Any]]:
        """All complete records of a log (a partial last line is ignored)."""
        text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
        lines = text.split("\n")
        complete = lines[:-1]  # the text after the last newline is partial (or empty)
        return [_upgrade(json.loads(line)) for line in complete if line]


def _upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """An older log's record under today's names. Older logs wrote the program's sandbox time
    twice, as `duration_s` and as `busy_s` (the same value), and the host's wall-clock around
    the sandbox call as `timings["execute_s"]` (now `sandbox_wall_s`)."""
    if "busy_s" in record:
        busy = record.pop("busy_s")
        record.setdefault("duration_s", busy)
    timings = record.get("timings")
    if isinstance(timings, dict) and "execute_s" in timings:
        timings.setdefault("sandbox_wall_s", timings.pop("execute_s"))
    return record


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / jax scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


class SolutionBuffer:
    """The best valid solutions so far, which improve prompts draw from."""

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self.items: list[dict[str, Any]] = []  # each: code, reward, score, outcome, episode_id

    def add(self, code: str, reward: float, **info: Any) -> None:
        if any(item["code"] == code for item in self.items):
            return
        self.items.append({"code": code, "reward": float(reward), **info})
        self.items.sort(key=lambda item: item["reward"], reverse=True)
        del self.items[self.capacity:]

    def sample(self, rng: random.Random) -> dict[str, Any] | None:
        """A solution, favouring better ones (rank-based weights 1/(rank+1))."""
        if not self.items:
            return None
        weights = [1.0 / (rank + 1) for rank in range(len(self.items))]
        return rng.choices(self.items, weights=weights, k=1)[0]

    def best(self) -> dict[str, Any] | None:
        return self.items[0] if self.items else None

    def __len__(self) -> int:
        return len(self.items)

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "items": self.items}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SolutionBuffer:
        buf = cls(state["capacity"])
        buf.items = list(state["items"])
        return buf
