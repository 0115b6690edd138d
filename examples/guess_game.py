"""An environment of your own, written to the environment contract, trained with the built-in harness.

The number-guessing game: the task holds a secret whole number in a range; the model calls the `guess` tool, which
answers `higher`, `lower` or `correct` and remembers, per game, how many guesses were made; the model's final
answer is the number. `GuessTool` is a `StatefulTool` (one session per trajectory); `GuessEnvironment` is an
`Environment`:

- `reset(request)` augments the request: it reads the secret from the task and returns a `Sample` whose messages
  pose the game (the task's own question is replaced) and whose task the reward reads.
- `step(sample)` returns `(observation, done, info)`: the tool's answers as one string (a `tool` message), or
  `(None, True, ...)` when the model answered without a call.
- `close(sample)` ends the game's session; it is idempotent and never raises.

One environment instance serves every trajectory at once: per-game state is keyed by `sample.id`.

    .venv/bin/agentic-rl train --config examples/train_guess_game.yaml
"""

from __future__ import annotations

import threading
from typing import Any

from agentic_rl import Environment, Sample, StatefulTool, ToolError, parse_tool_calls
from agentic_rl.parser import ToolCall
from agentic_rl.tools.prompt import tools_system_prompt

SYSTEM_PROMPT = (
    "You play a number-guessing game. Call the guess tool with a number; it answers higher, lower or correct. "
    "When it says correct, reply with that number and no tool call."
)


class GuessTool(StatefulTool):
    """`guess(number)` against the secret of one game; one session per trajectory."""

    name = "guess"
    description = "Guess the secret number. Returns 'higher', 'lower' or 'correct'."
    parameters = {
        "type": "object",
        "properties": {"number": {"type": "integer", "description": "your guess"}},
        "required": ["number"],
    }

    def __init__(self) -> None:
        self._games: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def open_game(self, session_id: str, secret: int) -> None:
        """Start the game of one trajectory (the environment calls it from `reset`)."""
        with self._lock:
            self._games[session_id] = {"secret": secret, "guesses": 0}

    def guesses(self, session_id: str) -> int:
        with self._lock:
            return self._games.get(session_id, {}).get("guesses", 0)

    def session_start(self, session_id: str) -> None:
        with self._lock:
            if session_id not in self._games:
                raise ToolError("no game is open for this trajectory")

    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        number = arguments.get("number")
        if isinstance(number, str) and number.strip().lstrip("-").isdigit():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int):
            raise ToolError(f"'number' must be an integer, got {number!r}")
        with self._lock:
            game = self._games[session_id]
            game["guesses"] += 1
            secret = game["secret"]
        if number == secret:
            return "correct"
        return "higher" if number < secret else "lower"

    def session_end(self, session_id: str) -> None:
        with self._lock:
            self._games.pop(session_id, None)


class GuessEnvironment(Environment):
    """The guessing game around one `GuessTool`.

    Args:
        low, high: the range the secret is drawn from (told to the model; a task may carry its own `low`/`high`).
    """

    def __init__(self, low: int = 1, high: int = 16) -> None:
        if low >= high:
            raise ValueError(f"low must be below high, got {low} and {high}")
        self.low, self.high = low, high
        self.tool = GuessTool()

    async def reset(self, request: dict[str, Any]) -> Sample:
        low, high = int(request.get("low", self.low)), int(request.get("high", self.high))
        secret = int(request["ground_truth"])
        sample_id = str(request["trajectory_id"])
        self.tool.open_game(sample_id, secret)
        question = f"I am thinking of a whole number from {low} to {high}. Find it."
        messages = [
            {"role": "system", "content": tools_system_prompt(SYSTEM_PROMPT, [self.tool.schema])},
            {"role": "user", "content": question},
        ]
        return Sample(id=sample_id, task={**request, "question": question}, messages=messages)

    async def step(self, sample: Sample) -> tuple[Any, bool, dict[str, Any]]:
        calls = parse_tool_calls(sample.messages[-1]["content"])
        if not calls:  # the final answer
            return None, True, {"tool_calls": 0, "guesses": self.tool.guesses(sample.id)}
        answers, errors = [], 0
        for call in calls:
            if not isinstance(call, ToolCall) or call.name != self.tool.name:
                answers.append("Error: call guess with {\"number\": N}")
                errors += 1
                continue
            try:
                answers.append(self.tool.execute_session(sample.id, call.arguments))
            except ToolError as exc:
                answers.append(f"Error: {exc}")
                errors += 1
        well_formed = sum(isinstance(c, ToolCall) for c in calls)
        info = {"tool_calls": len(calls), "tool_errors": errors, "well_formed_calls": well_formed}
        return "\n".join(answers), False, info

    async def close(self, sample: Sample) -> None:
        self.tool.session_end(sample.id)
