"""The Titanic survival task directory (docs/learning_check): `scripts/make_task_dir.py`'s
titanic-survival preset, under the name the earlier results give.

  python scripts/make_titanic_task.py /work/tasks/titanic-survival
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_task_dir import make  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    make("titanic-survival", Path(sys.argv[1]))
