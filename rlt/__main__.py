import sys

from rlt.cli import main

sys.exit(main())
