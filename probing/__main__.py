import sys

from probing.cli import main

sys.exit(main())
