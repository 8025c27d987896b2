# Gradient-boosted trees with native categoricals and arrival-date features.
import pandas as pd
from sklearn.ensemble import HistGradientBoostingRegressor

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cols = [c for c in test.columns if c not in ("id", "arrival_date")]
cat = [c for c in cols if not pd.api.types.is_numeric_dtype(test[c])]


def prep(df, cats=None):
    out = df[cols].copy()
    d = pd.to_datetime(df["arrival_date"])
    out["month"], out["weekday"], out["doy"] = d.dt.month, d.dt.weekday, d.dt.dayofyear
    for c in cat:
        out[c] = pd.Categorical(out[c], categories=None if cats is None else cats[c])
    return out


X = prep(train)
Xt = prep(test, {c: X[c].cat.categories for c in cat})
model = HistGradientBoostingRegressor(learning_rate=0.06, max_iter=400,
                                      categorical_features="from_dtype", random_state=0)
model.fit(X, train["avg_price_per_room"])
pd.DataFrame({"id": test["id"], "avg_price_per_room": model.predict(Xt)}).to_csv(
    "submission/submission.csv", index=False)
