from sparkdiag.cli import main

main()
