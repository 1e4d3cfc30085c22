"""The `tibnlp` command (and `python -m tibnlp`): the CLI, imported where a Ctrl-C during its
seconds of imports (torch, MLflow, scikit-learn) exits 130 without the traceback of whatever
import it stopped."""

import sys


def main() -> None:
    try:
        from tibnlp.cli.main import main as run
    except KeyboardInterrupt:  # (the commands themselves say "interrupted" and exit 130)
        sys.exit(130)
    run()
