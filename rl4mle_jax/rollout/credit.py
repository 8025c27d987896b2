"""Which response tokens a failure's reward is assigned to (`learner.failure_credit`).

The paper's PPO gives an episode's reward to every token of its response ("sequence"). A
syntax error is the exception where the environment knows the culprit: the parser names the
line (rl4mle_jax.env.actions.syntax_error_lines), and nothing of the program ran, so the other
lines are neither confirmed nor refuted by the outcome. With `failure_credit="error_line"` the
policy-gradient term of such an episode covers only the tokens of that line (RLTF's
fine-grained feedback for compile errors, Liu et al. 2023); the plan and the code before and
after it get no advantage, the critic's targets are unchanged. Runtime errors keep the whole
response: their traceback names where the error surfaced (often `model.fit(...)`), while the
culprit is usually an earlier line (a bad hyper-parameter, a wrong assignment), measured on the
default's runs (README, "Failure credit").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _line_bounds(code: str, first: int, last: int) -> tuple[int, int]:
    """Character offsets in `code` of the start of line `first` and the end of line `last`
    (past its newline; 1-based lines)."""
    starts = [0]
    for i, ch in enumerate(code):
        if ch == "\n":
            starts.append(i + 1)
    begin = starts[first - 1]
    end = starts[last] if last < len(starts) else len(code)
    return begin, end


def _first_prefix_at_least(n_tokens: int, length: Callable[[int], int], target: int) -> int:
    """The least k in [0, n_tokens] with length(k) >= target (n_tokens if none); `length` is
    non-decreasing in k."""
    lo, hi = 0, n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if length(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def error_token_span(response: str, response_ids: Sequence[int],
                     decode: Callable[[Sequence[int]], str], action: Any
                     ) -> tuple[int, int] | None:
    """[start, end) indices of the response tokens that hold the line(s) a syntax error names,
    or None (credit to the whole response): any other outcome, a truncated block (the length
    limit, not a line, is the cause), or a decode that does not give back `response` (then the
    character offsets would not be the tokens' own).

    decode(ids) must be the decoding that produced `response` (special tokens skipped). A token
    that straddles a boundary of the line is included. O(log n) decodes of prefixes.
    """
    if (getattr(action, "failure", None) != "syntax_error" or action.error_lines is None
            or action.code_offset is None or action.truncated or not response_ids):
        return None
    first, last = action.error_lines
    n_lines = action.code.count("\n") + 1
    if not 1 <= first <= last <= n_lines:
        return None
    begin, end = _line_bounds(action.code, first, last)
    begin, end = action.code_offset + begin, action.code_offset + end
    n = len(response_ids)
    if decode(list(response_ids)) != response or not 0 <= begin < end <= len(response):
        return None
    cache: dict[int, int] = {}

    def length(k: int) -> int:
        if k not in cache:
            cache[k] = len(decode(list(response_ids[:k])))
        return cache[k]

    # The token holding character `begin` is the last k with length(k) <= begin.
    start = _first_prefix_at_least(n, length, begin + 1) - 1
    stop = _first_prefix_at_least(n, length, end)
    start, stop = max(start, 0), max(stop, start + 1)
    return (start, min(stop, n)) if start < n else None
