# Ridge regression on numeric columns and one-hot categoricals.
import pandas as pd
from sklearn.compose import make_column_transformer
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cols = [c for c in test.columns if c not in ("id", "arrival_date")]
cat = [c for c in cols if not pd.api.types.is_numeric_dtype(test[c])]
num = [c for c in cols if c not in cat]
prep = make_column_transformer(
    (StandardScaler(), num), (OneHotEncoder(handle_unknown="ignore", min_frequency=5), cat))
model = make_pipeline(prep, Ridge(alpha=3.0))
model.fit(train[cols], train["avg_price_per_room"])
pred = model.predict(test[cols])
pd.DataFrame({"id": test["id"], "avg_price_per_room": pred}).to_csv(
    "submission/submission.csv", index=False)
