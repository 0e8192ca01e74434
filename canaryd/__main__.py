from canaryd.cli.app import main

main()
