from kvcal.cli import main
import sys

sys.exit(main())
