"""The trajectory viewer: a run folder -> one self-contained HTML page (`agentic-rl view RUN_DIR`)."""

from agentic_rl.viewer.page import (
    RunFile,
    build_view,
    find_trajectory_files,
    load_trajectories,
    run_model,
    view_records,
)

__all__ = ["RunFile", "build_view", "find_trajectory_files", "load_trajectories", "run_model", "view_records"]
