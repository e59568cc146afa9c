import sys

from lorabench.cli.main import main

sys.exit(main())
