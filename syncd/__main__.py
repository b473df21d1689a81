from syncd.cli.main import main

main()
