import sys

from kvcal.cli import main

sys.exit(main())
