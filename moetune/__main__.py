from moetune.cli.main import main

main()
