"""BM25 recall@k of the HotpotQA supporting documents with the local search tool's index.

    .venv/bin/python examples/deep_research/bm25_recall.py [--k 5]
"""

from __future__ import annotations

import argparse
import json

from agentic_rl.tools.search import bm25_recall_at_k


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default="../shared/data/corpus.jsonl")
    parser.add_argument("--questions", default="../shared/data/hotpotqa_dev_distractor_500.jsonl")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(bm25_recall_at_k(args.corpus, args.questions, k=args.k), indent=2))


if __name__ == "__main__":
    main()
