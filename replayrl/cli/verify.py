"""`replayrl verify CHECKPOINT...`: recompute the checksums a checkpoint's marker recorded (what resuming does)."""

from __future__ import annotations

from replayrl.cli.common import PROG, ArgParser, CLIError


def run(argv: list[str]) -> int:
    parser = ArgParser(
        prog=f"{PROG} verify",
        description="Check that every file of a checkpoint is the one its save wrote (size and checksum recorded "
        "in replayrl_complete.json); exit status 2 naming the damaged files otherwise.",
        allow_abbrev=False,
    )
    parser.add_argument("checkpoints", metavar="CHECKPOINT", nargs="+", help="a checkpoint-N directory")
    args = parser.parse_args(argv)
    from replayrl.checkpoints import CheckpointError, verify_checkpoint

    for checkpoint in args.checkpoints:
        try:
            checked = verify_checkpoint(checkpoint)
        except CheckpointError as err:
            raise CLIError(str(err)) from err
        if checked:
            print(f"{checkpoint}: ok ({checked} files match their recorded checksums)")
        else:
            print(f"{checkpoint}: complete, but its marker records no checksums (saved before replayrl recorded them)")
    return 0
