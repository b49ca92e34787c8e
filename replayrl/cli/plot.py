"""`replayrl plot RUN_DIR`: re-draw a run's plot from its metrics.jsonl (any trainer's run)."""

from __future__ import annotations

from replayrl.cli.common import PROG, ArgParser, CLIError
from replayrl.metrics import METRICS_FILE
from replayrl.metrics.plot import PlotUnavailable, plot_run


def run(argv: list[str]) -> int:
    parser = ArgParser(
        prog=f"{PROG} plot",
        description=f"Re-draw RUN_DIR/training.png from RUN_DIR/{METRICS_FILE}.",
        allow_abbrev=False,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="output_dir of a replayrl run (any trainer, CLI or Python)")
    parser.add_argument("--output", default=None, help="where to write the PNG (default: RUN_DIR/training.png)")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.output)
    except (FileNotFoundError, PlotUnavailable) as err:
        raise CLIError(str(err)) from err
    print(f"wrote {path}")
    return 0
