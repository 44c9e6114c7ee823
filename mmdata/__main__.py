import sys

from mmdata.tools.cli import main

sys.exit(main())
