# Ridge regression from the raw absorbance spectrum to the three contents.
import numpy as np
import pandas as pd
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

targets = ["water", "fat", "protein"]
train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
features = [c for c in test.columns if c.startswith("x_")]
model = make_pipeline(StandardScaler(), Ridge(alpha=1.0))
model.fit(train[features], train[targets])
pred = np.clip(model.predict(test[features]), 0, None)
sub = pd.DataFrame(pred, columns=targets)
sub.insert(0, "id", test["id"].values)
sub.to_csv("submission/submission.csv", index=False)
