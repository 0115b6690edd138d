"""A dense toy reward for training smoke tests on a random-weight model (importable as `toy_rewards:e_share`)."""


def e_share(task, messages):
    """Share of the letter 'e' in the final answer: varies across random samples, so groups carry signal."""
    text = messages[-1]["content"] if messages else ""
    return text.count("e") / max(len(text), 1)
