import sys

from rlt.dynamo.main import main

sys.exit(main())
