"""``python -m topk_cli`` runs the ``softtopk`` command."""

from topk_cli.cli import main

main()
