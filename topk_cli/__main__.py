"""``python -m topk_cli`` runs the ``softtopk`` command."""

import sys

try:
    from topk_cli.cli import main
except KeyboardInterrupt:  # interrupted while importing: still one line, exit 130
    sys.stderr.write("softtopk: interrupted\n")
    sys.exit(130)

main()
