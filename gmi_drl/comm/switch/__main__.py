import sys

from gmi_drl.comm.switch.cli import main

sys.exit(main())
