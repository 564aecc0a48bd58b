from dspark_compile.cli import compile_main

compile_main()
