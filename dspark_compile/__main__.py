"""``python -m dspark_compile [verify|bench|sweep] [overrides]``: the commands without their
console scripts (``dspark-compile`` when no command is named)."""

import sys

from dspark_compile import cli

COMMANDS = {"verify": cli.verify_main, "bench": cli.bench_main, "sweep": cli.sweep_main}

if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
    main = COMMANDS[sys.argv.pop(1)]
else:
    main = cli.compile_main
main()
