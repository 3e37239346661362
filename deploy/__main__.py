"""python -m deploy: the deploy CLI (deploy/cli.py) recording into a JSON-lines audit file."""
import sys

from .cli import main

sys.exit(main())
