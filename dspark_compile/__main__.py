"""``python -m dspark_compile [verify|bench|sweep|artifacts] [arguments]``: the commands
without their console scripts (``dspark-compile`` when no command is named)."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "artifacts":  # no Hydra for the cache's command
    from dspark_compile.tools.artifacts import main as artifacts_main

    sys.argv.pop(1)
    artifacts_main()
else:
    from dspark_compile import cli

    COMMANDS = {"verify": cli.verify_main, "bench": cli.bench_main, "sweep": cli.sweep_main}
    main = COMMANDS[sys.argv.pop(1)] if len(sys.argv) > 1 and sys.argv[1] in COMMANDS \
        else cli.compile_main
    main()
