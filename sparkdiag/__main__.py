from sparkdiag.entry import main

main()
