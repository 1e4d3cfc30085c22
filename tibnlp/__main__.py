"""`python -m tibnlp ...`: the same CLI as the `tibnlp` command."""

from tibnlp.cli.entry import main

main()
