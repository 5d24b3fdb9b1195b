import sys

from greta.cli import main

sys.exit(main())
