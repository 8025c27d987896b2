"""The warm start the tests that run the loop or the filter share (conftest's `warm_cache`)."""

# The default warm start with a shorter evaluation of its own (smaller ones write too few valid
# programs for the loop's assertions).
WARMSTART_SETTINGS = {"eval_samples": 2}


def warm_config(cache_dir):
    """configs/task.py with its warm start read from (or built into) `cache_dir`."""
    from configs import task as task_config

    cfg = task_config.get_config()
    cfg.warmstart.cache_dir = str(cache_dir)
    cfg.warmstart.settings.update(WARMSTART_SETTINGS)
    cfg.mesh.data = 1
    # No compile before the clock: these loops run by steps, not time, and would compile
    # sampler programs they never call (test_train's end-to-end test turns it on).
    cfg.run.warmup = False
    return cfg
