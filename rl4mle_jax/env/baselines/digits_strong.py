# RBF support vector machine.
import pandas as pd
from sklearn.svm import SVC

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
pixels = [c for c in test.columns if c.startswith("pixel")]
model = SVC(C=10.0, gamma=0.02)
model.fit(train[pixels] / 16.0, train["label"])
pd.DataFrame({"id": test["id"], "label": model.predict(test[pixels] / 16.0)}).to_csv(
    "submission/submission.csv", index=False)
