# Ridge regression on log(price) with one-hot grades.
import numpy as np
import pandas as pd
from sklearn.compose import make_column_transformer
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
cat = ["cut", "color", "clarity"]
num = ["carat", "depth", "table", "x", "y", "z"]
prep = make_column_transformer(
    (StandardScaler(), num), (OneHotEncoder(handle_unknown="ignore"), cat))
model = make_pipeline(prep, Ridge(alpha=1.0))
model.fit(train[num + cat], np.log1p(train["price"]))
pred = np.clip(np.expm1(model.predict(test[num + cat])), 0, None)
pd.DataFrame({"id": test["id"], "price": pred}).to_csv("submission/submission.csv", index=False)
