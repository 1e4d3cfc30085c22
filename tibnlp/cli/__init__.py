"""The `tibnlp` command line: one small module per command group, no logic of its own.

Importing the CLI takes seconds (torch, DeepSpeed, MLflow). A worker whose launcher is
killed in that time would note the process that adopted it as its parent and run on: the
launcher watch is armed here, before them, for the `tibnlp` command, `-m tibnlp` and
`-m tibnlp.cli.main` alike (`stopping.watch_launcher`; nothing unless a launcher started
this process). For the same seconds, `entry.main` turns a Ctrl-C into exit 130 without the
traceback of whatever import it stopped."""

from tibnlp.stopping import watch_launcher

watch_launcher()
