"""Helpers shared by the tests (not tests themselves), imported as `from support.<module> import ...`: pytest puts
`tests/` on `sys.path` when it imports the top-level `tests/conftest.py`.

- `chat_templates`: the chat templates of tool-using and reasoning model families (tests/fixtures/templates), each on
  SmolLM2's tokenizer given the family's control tokens, and what `ChatRenderer` makes of each.
- `derived_builders`: build and fingerprint recipes for the derived-model registry test, registered as callables
  (`models.register_model`).
- `engines`: engine decorators (scripted, steered, forced-call, recording) that delegate to the real engine, and an
  environment that counts its sessions.
- `exact`: the check that a captured trajectory is one exact token sequence (server capture and framework tests).
- `fake_web`: a loopback fake of the Serper, SerpApi, Jina Reader and OpenAI-summary services, with its fixtures.
- `launch`: free loopback port pairs for tests that start several ranks.
- `processes`: driving an `agentic-rl` subprocess to a known point and killing it there; `cli_env` puts `tests/` on
  the child's `PYTHONPATH` so configs can name `support.toy_rewards:...`.
- `server`: the model name the session's test server serves its engine under.
- `toy_rewards`: dense toy rewards for training smoke tests on a random-weight model, named in run configs as
  `support.toy_rewards:e_share` (`e_share_held` stops a run at a known point).
- `train_runs`: the smallest `agentic-rl train` config that exercises the whole loop on the tiny random model.
- `wandb_records`: a reader of wandb offline run files (`run-ID.wandb`), to check what the wandb logger wrote.
"""
