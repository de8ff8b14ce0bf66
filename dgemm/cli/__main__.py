from dgemm.cli import main

main()
