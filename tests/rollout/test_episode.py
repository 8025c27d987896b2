"""Episode runner: an instrumenter that never answers falls back to static instrumentation."""

import asyncio

from rl4mle_jax.env.instrument_lm import Instrumenter
from rl4mle_jax.rollout.episode import EpisodeConfig, EpisodeRunner

CODE = ('import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n'
        'train = pd.read_csv("./input/train.csv")\nm = LogisticRegression()\n'
        'm.fit(train[["x"]], train["y"])\n')


class _HungModel:
    """A frozen-copy service whose answer never arrives (a stuck device, say)."""

    async def generate(self, prompt_ids):
        await asyncio.sleep(3600)


class _CharTokenizer:
    is_chat = False

    def encode(self, text):
        return [ord(c) % 256 for c in text]


def test_instrumenter_timeout_falls_back_to_static():
    instrumenter = Instrumenter("lm", generate=lambda prompt: "")
    runner = EpisodeRunner(
        task=None, tokenizer=_CharTokenizer(), policy=None, sandbox=None,
        instrumenter=instrumenter, buffer=None, context=None,
        cfg=EpisodeConfig(instrument_timeout_s=0.2), reward_cfg=None, prompt_cfg=None,
        frozen=_HungModel())
    program = asyncio.run(runner._instrument(CODE))
    assert program.method == "static_fallback"
    assert program.verification["reason"] == "timeout"
    assert "model_trained" in program.milestones
    assert instrumenter.metrics()["instrument/lm_rejected_timeout"] == 1.0
